/* serve.c — `zeroserve serve`: starts the HTTP server first (so /health answers 503 while the
 * model loads), loads the engine and the scheduler in a background thread, then serves the
 * OpenAI API until SIGTERM/SIGINT, when it stops accepting, drains in-flight requests (bounded)
 * and frees everything. With a data directory it also serves the fine-tuning API
 * (finetune-api.h): uploaded files, jobs trained beside serving, and their models. LoRA
 * adapters given with --lora NAME=DIR are loaded against the base before it is attached (a bad
 * one fails the start with its name and directory) and served over it from the first request.
 * Run-time loading (POST /v1/load_lora_adapter) is confined to the --lora-dir directories, off
 * without one. Signals are taken with sigwait in the main thread; no handler runs. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api.h"
#include "api-extra.h"
#include "api-models.h"
#include "chat.h"
#include "cluster.h"
#include "cli.h"
#include "common.h"
#include "device.h"
#include "engine-flags.h"
#include "fileio.h"
#include "finetune-api.h"
#include "lora.h"

struct zs_server {
    zs_server_opts o;
    zs_zero_opts train_config; /* the copy o.train_config pointed to */
    char *model_dir, *nvme_path, *name, *data_dir;
    char *draft_path;           /* --draft-model, or NULL */
    zs_model_opts draft_model;  /* its weight dtype (--draft-weight-dtype) */
    char **lora_names, **lora_dirs; /* --lora NAME=DIR, split */
    int n_loras;
    zs_files *files;
    zs_ftjobs *ftjobs;
    zs_http *http;
    zs_api *api;
    pthread_t loader;
    int loader_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 loading, 1 loaded, < 0 load error */
    char errmsg[512];
    zs_engine *engine;
    zs_sched *sched;
    zs_spec *spec;  /* the scheduler's draft proposer (freed after it) */
    void (*on_loaded)(void *, int);
    void *ud;
};

/* Loads the --lora adapters against e's model into ls (n_loras entries). */
static int load_loras(zs_server *s, zs_engine *e, zs_lora **ls) {
    for (int i = 0; i < s->n_loras; i++) {
        int rc = zs_api_adapter_open(e, s->lora_dirs[i], &ls[i]);
        if (rc < 0) {
            for (int k = 0; k < i; k++) zs_lora_free(ls[k]);
            return zs_err_prefix(rc, "--lora %s=%s", s->lora_names[i], s->lora_dirs[i]);
        }
    }
    return 0;
}

/* --speculative and --draft-model together (checked at start): "none", "ngram" or "draft". */
static int spec_kind(const zs_server_opts *o, const char **kind) {
    const char *k = o->speculative && *o->speculative ? o->speculative : NULL;
    int draft = o->draft_model && *o->draft_model;
    if (o->draft_weight_dtype && !draft)
        return zs_err(ZS_EINVAL, "--draft-weight-dtype %s needs --draft-model PATH", o->draft_weight_dtype);
    if (k && strcmp(k, "none") && strcmp(k, "ngram") && strcmp(k, "draft"))
        return zs_err(ZS_EINVAL, "--speculative must be none, ngram or draft (got '%s')", k);
    if (k && draft && strcmp(k, "draft"))
        return zs_err(ZS_EINVAL, "--speculative %s and --draft-model %s: a draft model is speculation with it (give "
                      "--speculative draft, or leave one of them out)", k, o->draft_model);
    if (k && !strcmp(k, "draft") && !draft) return zs_err(ZS_EINVAL, "--speculative draft needs --draft-model PATH");
    *kind = draft ? "draft" : k ? k : "none";
    return 0;
}

/* The draft proposer that --speculative / --draft-model name (NULL for none). The draft model
 * keeps a KV sequence for each sequence the scheduler runs at once, at the model's context. */
static int open_spec(zs_server *s, zs_engine *e, zs_spec **out) {
    const char *k = "none";
    *out = NULL;
    ZS_CHECK(spec_kind(&s->o, &k));
    if (!strcmp(k, "ngram")) return zs_spec_ngram_new(ZS_SPEC_NGRAM_MIN, ZS_SPEC_NGRAM_MAX, out);
    if (strcmp(k, "draft")) return 0;
    zs_engine_opts d;
    zs_engine_opts_default(&d);
    d.model_dir = s->draft_path;
    d.model = s->draft_model;
    int seqs = s->o.sched.max_seqs > 0 ? s->o.sched.max_seqs : 32;
    d.max_seqs = ZS_MIN(seqs, zs_engine_max_seqs(e) * zs_world_ranks(zs_engine_world(e)));
    d.max_batch_tokens = zs_engine_max_batch_tokens(e);
    d.kv_dtype = s->o.engine.kv_dtype;
    return zs_spec_draft_new(&d, e, s->model_dir, out);
}

static void *loader_main(void *arg) {
    zs_server *s = arg;
    double t0 = zs_now();
    zs_engine *e = NULL;
    zs_sched *sc = NULL;
    zs_lora **ls = s->n_loras ? calloc((size_t)s->n_loras, sizeof *ls) : NULL;
    int rc = s->n_loras && !ls ? zs_err(ZS_ENOMEM, "serve: out of memory") : 0;
    if (rc == 0) rc = zs_engine_open(&s->o.engine, &e);
    zs_spec *spec = NULL;
    if (rc == 0) rc = open_spec(s, e, &spec);
    if (rc == 0) {
        zs_sched_opts so = s->o.sched;
        so.spec = spec;
        rc = zs_sched_new(e, &so, &sc);
        if (rc < 0) zs_err_prefix(rc, "scheduler");
    }
    if (rc == 0) rc = load_loras(s, e, ls); /* before /health says ok */
    /* listed before the base is attached: no request sees the base without them (the names
     * were checked at start: only memory fails here) */
    for (int i = 0; rc == 0 && i < s->n_loras; i++) {
        rc = zs_api_preload_adapter(s->api, s->lora_names[i], s->lora_dirs[i], ls[i]);
        if (rc < 0) {
            zs_err_prefix(rc, "--lora %s=%s", s->lora_names[i], s->lora_dirs[i]);
            for (int k = i + 1; k < s->n_loras; k++) zs_lora_free(ls[k]);
        }
    }
    free(ls);
    if (rc < 0) {
        if (sc) zs_sched_free(sc);
        zs_spec_free(spec);
        if (e) zs_engine_free(e);
        sc = NULL;
        spec = NULL;
        e = NULL;
    }
    if (rc == 0) zs_api_attach(s->api, e, sc);
    if (rc == 0 && s->ftjobs && zs_ftjobs_start(s->ftjobs, e, sc) < 0)
        zs_log_error("fine-tuning: %s", zs_errmsg()); /* serving goes on without the runner */
    pthread_mutex_lock(&s->mu);
    s->engine = e;
    s->sched = sc;
    s->spec = spec;
    s->state = rc == 0 ? 1 : rc;
    if (rc < 0) snprintf(s->errmsg, sizeof s->errmsg, "%s", zs_errmsg()[0] ? zs_errmsg() : zs_strerror(rc));
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc == 0 && !s->o.quiet) fprintf(stderr, "zeroserve: ready (loaded in %.1f s)\n", zs_now() - t0);
    if (s->on_loaded) s->on_loaded(s->ud, rc);
    return NULL;
}

/* the model id by default: the directory's name, or a GGUF file's name without ".gguf" */
static char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    if (n - b > 5 && !strncasecmp(dir + n - 5, ".gguf", 5)) n -= 5;
    return strndup(dir + b, n - b);
}

static void server_free(zs_server *s) {
    free(s->model_dir);
    free(s->nvme_path);
    free(s->name);
    free(s->data_dir);
    free(s->draft_path);
    for (int i = 0; i < s->n_loras; i++) {
        free(s->lora_names[i]);
        free(s->lora_dirs[i]);
    }
    free(s->lora_names);
    free(s->lora_dirs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int zs_server_start(const zs_server_opts *o, void (*on_loaded)(void *ud, int rc), void *ud,
                    zs_server **out) {
    if (!o || !out || !o->engine.model_dir) return zs_err(ZS_EINVAL, "serve: --model is required");
    zs_server *s = calloc(1, sizeof *s);
    if (!s) return zs_err(ZS_ENOMEM, "serve: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->o = *o;
    if (o->train_config) s->train_config = *o->train_config;
    /* the served engines (the base model, fine-tuned models) are inference engines: embedding
     * rows from host tables; the fine-tuning runner opens its training engines without */
    s->o.engine.model.embed_lookup = 1;
    s->on_loaded = on_loaded;
    s->ud = ud;
    s->model_dir = strdup(o->engine.model_dir);
    s->nvme_path = o->engine.nvme_path ? strdup(o->engine.nvme_path) : NULL;
    s->name = o->model_name && *o->model_name ? strdup(o->model_name) : base_name(o->engine.model_dir);
    if (!s->model_dir || !s->name || (o->engine.nvme_path && !s->nvme_path)) {
        server_free(s);
        return zs_err(ZS_ENOMEM, "serve: out of memory");
    }
    s->o.engine.model_dir = s->model_dir;
    s->o.engine.nvme_path = s->nvme_path;
    s->o.model_name = s->name;
    s->data_dir = o->data_dir ? strdup(o->data_dir) : NULL;
    s->o.data_dir = s->data_dir;
    const char *kind;
    int src = spec_kind(o, &kind);
    if (src == 0 && o->draft_model && *o->draft_model) {
        zs_model_opts_default(&s->draft_model);
        src = zs_engine_flags_weight_dtype("--draft-weight-dtype", o->draft_weight_dtype, &s->draft_model);
        s->draft_model.embed_lookup = 1; /* an inference engine, as the served one */
        s->draft_path = strdup(o->draft_model);
        if (src == 0 && !s->draft_path) src = zs_err(ZS_ENOMEM, "serve: out of memory");
    }
    s->o.draft_model = s->draft_path;
    s->o.draft_weight_dtype = NULL; /* parsed into draft_model */
    if (src < 0) {
        server_free(s);
        return src;
    }
    s->o.http.api_key = NULL; /* not kept: the HTTP layer copies it */
    s->o.http.key_file = NULL;
    s->o.http.tls_cert = s->o.http.tls_key = s->o.http.allowed_origins = NULL;
    s->o.loras = NULL;        /* kept split in lora_names / lora_dirs */
    s->o.lora_dirs = NULL;    /* resolved and kept by the api */
    s->o.n_lora_dirs = 0;
    s->o.n_loras = 0;
    if (o->n_loras > 0) {
        s->lora_names = calloc((size_t)o->n_loras, sizeof *s->lora_names);
        s->lora_dirs = calloc((size_t)o->n_loras, sizeof *s->lora_dirs);
        if (!s->lora_names || !s->lora_dirs) {
            server_free(s);
            return zs_err(ZS_ENOMEM, "serve: out of memory");
        }
    }
    for (int i = 0; i < o->n_loras; i++) {
        const char *spec = o->loras[i] ? o->loras[i] : "";
        const char *eq = strchr(spec, '=');
        if (!eq || eq == spec || !eq[1]) {
            server_free(s);
            return zs_err(ZS_EINVAL, "--lora '%s': expected NAME=DIR (the name clients give as \"model\", the PEFT "
                          "adapter directory)", spec);
        }
        s->lora_names[i] = strndup(spec, (size_t)(eq - spec));
        s->lora_dirs[i] = strdup(eq + 1);
        s->n_loras = i + 1;
        if (!s->lora_names[i] || !s->lora_dirs[i]) {
            server_free(s);
            return zs_err(ZS_ENOMEM, "serve: out of memory");
        }
        int dup = !strcmp(s->lora_names[i], s->name);
        for (int k = 0; k < i && !dup; k++) dup = !strcmp(s->lora_names[k], s->lora_names[i]);
        if (dup) {
            int rc = zs_err(ZS_EINVAL, "--lora %s: the name '%s' is already served (%s)", spec, s->lora_names[i],
                            !strcmp(s->lora_names[i], s->name) ? "the base model" : "another --lora");
            server_free(s);
            return rc;
        }
    }

    /* the audit log lives with the files and jobs it records */
    char *audit = NULL;
    zs_http_opts ho = o->http;
    if (s->data_dir) {
        int e = zs_mkdir_p(s->data_dir);
        if (e == 0 && asprintf(&audit, "%s/audit.jsonl", s->data_dir) < 0) {
            audit = NULL;
            e = zs_err(ZS_ENOMEM, "serve: out of memory");
        }
        if (e < 0) {
            server_free(s);
            return e;
        }
        ho.audit_path = audit;
    }
    int rc = zs_http_start(&ho, &s->http);
    free(audit);
    if (rc < 0) {
        server_free(s);
        return rc;
    }
    zs_api_opts ao = {s->name, s->model_dir, o->chat_template, o->lora_dirs, o->n_lora_dirs};
    rc = zs_api_new(s->http, &ao, &s->api);
    if (rc < 0) {
        zs_http_stop(s->http, 0);
        server_free(s);
        return rc;
    }
    if (s->data_dir) {
        zs_ftjobs_opts fo = {s->data_dir, s->name, s->model_dir, &s->o.engine, &s->o.sched, s->api, NULL,
                             s->o.train_config ? &s->train_config : NULL};
        rc = zs_files_open(s->http, s->data_dir, o->max_file_bytes, &s->files);
        fo.files = s->files;
        if (rc == 0) rc = zs_ftjobs_open(s->http, &fo, &s->ftjobs);
        if (rc < 0) {
            zs_http_stop(s->http, 0);
            zs_files_free(s->files);
            zs_api_free(s->api);
            server_free(s);
            return rc;
        }
    }
    if (!o->quiet) {
        const char *host = o->http.host ? o->http.host : "127.0.0.1";
        int v6 = strchr(host, ':') != NULL;
        fprintf(stderr, "zeroserve: listening on %s://%s%s%s:%d (model %s)\n", zs_http_tls(s->http) ? "https" : "http",
                v6 ? "[" : "", host, v6 ? "]" : "", zs_http_port(s->http), s->name);
    }
    if (pthread_create(&s->loader, NULL, loader_main, s) != 0) {
        zs_http_stop(s->http, 0);
        zs_ftjobs_free(s->ftjobs);
        zs_files_free(s->files);
        zs_api_free(s->api);
        server_free(s);
        return zs_err(ZS_ENOMEM, "serve: cannot start the loader thread");
    }
    s->loader_started = 1;
    *out = s;
    return 0;
}

int zs_server_port(const zs_server *s) { return s ? zs_http_port(s->http) : 0; }
zs_http *zs_server_http(zs_server *s) { return s ? s->http : NULL; }

int zs_server_wait_loaded(zs_server *s, double timeout_s) {
    double end = zs_now() + timeout_s;
    pthread_mutex_lock(&s->mu);
    while (s->state == 0 && zs_now() < end) {
        pthread_mutex_unlock(&s->mu);
        usleep(10000);
        pthread_mutex_lock(&s->mu);
    }
    int st = s->state;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", s->errmsg);
    pthread_mutex_unlock(&s->mu);
    if (st == 1) return 0;
    if (st == 0) return zs_err(ZS_EBUSY, "serve: the model is still loading");
    return zs_err(st, "%s", msg);
}

void zs_server_stop(zs_server *s, double drain_s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    zs_sched *sc = s->state == 1 ? s->sched : NULL;
    pthread_mutex_unlock(&s->mu);
    /* stop admitting, let running and queued requests finish (bounded), cancel the rest */
    zs_api_drain(s->api);
    if (s->loader_started) pthread_join(s->loader, NULL); /* the job runner starts from there */
    s->loader_started = 0;
    zs_ftjobs_stop(s->ftjobs, drain_s); /* a running job stops before its next step */
    if (sc) zs_sched_drain(sc, drain_s);
    /* stop accepting; what is left of the responses gets a moment to flush */
    zs_http_stop(s->http, sc ? 2.0 : 0.5);
    if (s->sched) zs_sched_free(s->sched); /* the last callbacks run here */
    zs_spec_free(s->spec);
    zs_ftjobs_free(s->ftjobs);
    zs_files_free(s->files);
    zs_api_free(s->api);
    if (s->engine) zs_engine_free(s->engine);
    server_free(s);
}

/* ------------------------------------------------------------------ the command */

static void on_loaded_cmd(void *ud, int rc) {
    (void)ud;
    if (rc < 0) kill(getpid(), SIGUSR1); /* wakes sigwait in the main thread */
}

/* process 0 of several: a peer process is gone */
static void on_lost_cmd(void *ud, const char *msg) {
    (void)ud, (void)msg;
    kill(getpid(), SIGUSR1);
}

/* The followers of a multi-process world serve nothing: they open the same engine and run the
 * step plans of process 0 until it stops. */
static int follow(const zs_engine_opts *eo) {
    zs_engine *e;
    ZS_CHECK(zs_engine_open(eo, &e));
    int rc = zs_engine_follow(e);
    zs_engine_free(e);
    return rc;
}

#define LOST_GRACE_S 3

static int want_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

/* --train-share and --train-slice-ms (strings: a float would turn 0.4 into 0.4000000059, which a
 * job's share, F/2 for "priority": "low", would show) into o. */
static int train_flags(const char *share, const char *slice_ms, zs_sched_opts *o) {
    char *end;
    double f = strtod(share, &end);
    if (!*share || *end || !(f >= 0 && f <= 1))
        return zs_err(ZS_ERANGE, "--train-share must be a number between 0 and 1 (got '%s'; 0: fine-tuning only while "
                      "no request is queued or running)", share);
    double ms = strtod(slice_ms, &end);
    if (!*slice_ms || *end || !(ms > 0 && ms <= 60000))
        return zs_err(ZS_ERANGE, "--train-slice-ms must be a positive number of milliseconds, at most 60000 (got '%s')",
                      slice_ms);
    o->train_share = f;
    o->train_slice_ms = ms;
    return 0;
}

#define ZS_SERVE_MAX_LORAS 64     /* --lora flags at most (more at run time: POST /v1/load_lora_adapter) */
#define ZS_SERVE_MAX_LORA_DIRS 16 /* --lora-dir flags at most */

/* serve's own flags in the table below (the engine's follow them) */
#define SERVE_FLAGS 28

int zs_cmd_serve(int argc, char **argv) {
    const char *tls_cert = NULL, *tls_key = NULL, *origins = NULL;
    const char *host = "127.0.0.1", *api_key = NULL, *tmpl_name = "auto", *name = NULL, *key_file = NULL;
    int port = 8080, max_seqs = 32, max_batch = 256, max_queue = 256, threads = 4;
    int64_t max_body = 8388608, max_file = 0;
    const char *data_dir = "./zeroserve-data";
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    ef.ds_uses = ZS_DS_USE_ENGINE | ZS_DS_USE_JOBS; /* fine-tuning jobs: loss scaling, offload_optimizer, the 16-bit save */
    const char *loras[ZS_SERVE_MAX_LORAS], *lora_dirs[ZS_SERVE_MAX_LORA_DIRS];
    zs_opt_list lora_list = {loras, 0, ZS_SERVE_MAX_LORAS}, lora_dir_list = {lora_dirs, 0, ZS_SERVE_MAX_LORA_DIRS};
    const char *pooling = "mean";
    int no_prefix_cache = 0, spec_tokens = 0;
    const char *speculative = NULL, *draft_model = NULL, *draft_dtype = NULL;
    const char *spec_tree = "off";
    const char *train_share = "0.25", *train_slice = "10", *train_fuse = "on";
    zs_opt opts[SERVE_FLAGS + ZS_ENGINE_FLAG_COUNT] = {
        {"host", ZS_OPT_STR, &host, "address to listen on (default 127.0.0.1; 0.0.0.0 for all)"},
        {"port", ZS_OPT_INT, &port, "TCP port (default 8080; 0 = any free port)"},
        {"api-key", ZS_OPT_STR, &api_key, "require \"Authorization: Bearer KEY\", one admin key (default: $ZS_API_KEY, else none)"},
        {"api-key-file", ZS_OPT_STR, &key_file, "API keys with tenants and roles, one per line: KEY TENANT ROLE [rpm=N tpm=N streams=N jobs=N]; KEY or sha256:HEX, ROLE inference | finetune | admin; reloaded on SIGHUP; a limit reached answers 429 naming it; files, jobs and fine-tuned models belong to their tenant"},
        {"tls-cert", ZS_OPT_STR, &tls_cert, "serve HTTPS with this PEM certificate (chain) file; with --tls-key "
                                             "(default: plain HTTP)"},
        {"tls-key", ZS_OPT_STR, &tls_key, "the PEM private key of --tls-cert (unencrypted; chmod 600)"},
        {"allowed-origins", ZS_OPT_STR, &origins, "CORS: browser pages from these origins may call the API: "
                                                  "comma-separated scheme://host[:port], or '*' for any (default: "
                                                  "none, no CORS headers)"},
        {"max-seqs", ZS_OPT_INT, &max_seqs, "sequences generated at once (default 32)"},
        {"max-batch-tokens", ZS_OPT_INT, &max_batch, "tokens per engine step (default 256)"},
        {"max-queue", ZS_OPT_INT, &max_queue, "waiting requests at most; beyond it 429 (default 256)"},
        {"no-prefix-cache", ZS_OPT_FLAG, &no_prefix_cache, "do not keep prompts' KV blocks for later requests with the same prefix"},
        {"speculative", ZS_OPT_STR, &speculative, "none | ngram | draft: draft tokens verified many per weight pass "
                                                   "(ngram: prompt lookup; draft: --draft-model; default none, or draft "
                                                   "with --draft-model)"},
        {"draft-model", ZS_OPT_STR, &draft_model, "a small model with the same vocabulary whose greedy tokens are the "
                                                   "drafts (HF directory or GGUF file; resident on the CPU, its own KV "
                                                   "cache)"},
        {"draft-weight-dtype", ZS_OPT_STR, &draft_dtype, "the draft model's weights: the choices of --weight-dtype "
                                                         "(default auto: as stored)"},
        {"spec-tokens", ZS_OPT_INT, &spec_tokens, "drafts per sequence and step (default 0: chosen from the measured "
                                                   "stream and compute times; at most 16)"},
        {"spec-tree", ZS_OPT_STR, &spec_tree, "on | off: drafts may branch (several continuations verified in one pass; "
                                               "with --speculative ngram; default off)"},
        {"max-body-bytes", ZS_OPT_I64, &max_body, "largest request body (default 8388608)"},
        {"chat-template", ZS_OPT_STR, &tmpl_name, "auto | llama-2 | llama-3 | chatml | gemma | phi3 | mistral | plain (default auto)"},
        {"served-model-name", ZS_OPT_STR, &name, "model id in the API (default: the model directory's name, or the GGUF file's without .gguf)"},
        {"threads", ZS_OPT_INT, &threads, "HTTP threads (default 4)"},
        {"data-dir", ZS_OPT_STR, &data_dir, "uploaded files, fine-tuning jobs and fine-tuned models (default ./zeroserve-data)"},
        {"max-file-bytes", ZS_OPT_I64, &max_file, "largest uploaded training file (default: --max-body-bytes)"},
        {"lora", ZS_OPT_LIST, &lora_list, "NAME=DIR: serve the PEFT LoRA adapter in DIR over the model as \"model\": NAME "
                                          "(repeatable; more at run time: POST /v1/load_lora_adapter)"},
        {"lora-dir", ZS_OPT_LIST, &lora_dir_list, "DIR: POST /v1/load_lora_adapter may load adapters under DIR (a lora_path "
                                                  "relative to it, or an absolute one inside it; repeatable, at most 16; "
                                                  "without it run-time loading is off)"},
        {"pooling", ZS_OPT_STR, &pooling, "mean | last: how /v1/embeddings pools the final hidden states of an input's "
                                          "tokens (default mean; a request's \"pooling\" overrides it)"},
        {"train-share", ZS_OPT_STR, &train_share, "F, 0..1: fine-tuning's share of the engine's time while requests are "
                                                   "served too (default 0.25; 0: training only when no request is queued "
                                                   "or running); a job's \"priority\" low/high halves/doubles it"},
        {"train-fuse", ZS_OPT_STR, &train_fuse, "on | off: a LoRA job's micro-batch forwards ride serving steps' weight "
                                                 "gathers (default on: dense models on the CPU device; MoE or CUDA: never; off: every "
                                                 "training slice streams its own)"},
        {"train-slice-ms", ZS_OPT_STR, &train_slice, "the longest piece of training run between serving steps, in "
                                                      "milliseconds (a positive number; default 10; a slice is at least "
                                                      "one unit: one layer of one micro-batch)"},
    };
    ZS_ASSERT(opts[SERVE_FLAGS - 1].name && !opts[SERVE_FLAGS].name); /* SERVE_FLAGS counts the table */
    int n_opts = zs_engine_flags_table(&ef, opts, SERVE_FLAGS);
    if (want_help(argc, argv)) {
        zs_cli_usage("serve", "Serves the model over an OpenAI-compatible HTTP API until SIGTERM/SIGINT.", opts,
                     n_opts);
        return 0;
    }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    zs_sched_opts tso = {0};
    ZS_CHECK(train_flags(train_share, train_slice, &tso));
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (port < 0 || port > 65535) return zs_err(ZS_EINVAL, "--port must be between 0 and 65535");
    if (max_seqs < 1 || max_batch < 1 || max_queue < 1)
        return zs_err(ZS_EINVAL, "--max-seqs, --max-batch-tokens and --max-queue must be >= 1");
    if (max_body < 1) return zs_err(ZS_EINVAL, "--max-body-bytes must be >= 1");
    if (max_file < 0) return zs_err(ZS_EINVAL, "--max-file-bytes must be >= 0");
    if (!*data_dir) return zs_err(ZS_EINVAL, "--data-dir must not be empty");
    if (threads < 1 || threads > 256) return zs_err(ZS_EINVAL, "--threads must be between 1 and 256");
    if (strcmp(pooling, "mean") && strcmp(pooling, "last"))
        return zs_err(ZS_EINVAL, "--pooling must be mean or last (got '%s')", pooling);
    zs_api_set_default_pooling(!strcmp(pooling, "last") ? ZS_POOL_LAST : ZS_POOL_MEAN);
    int tmpl;
    ZS_CHECK(zs_chat_template_parse(tmpl_name, &tmpl));
    if (key_file && api_key) return zs_err(ZS_EINVAL, "--api-key and --api-key-file: give one (a key file's admin line is the single key)");
    if (!!(tls_cert && *tls_cert) != !!(tls_key && *tls_key))
        return zs_err(ZS_EINVAL, "%s: --tls-cert and --tls-key go together (the certificate and its private key); give "
                      "both, or neither for plain HTTP", tls_cert && *tls_cert ? "--tls-cert without --tls-key"
                                                                            : "--tls-key without --tls-cert");
    if (!api_key && !key_file) api_key = getenv("ZS_API_KEY");
    else if (key_file && getenv("ZS_API_KEY") && *getenv("ZS_API_KEY"))
        zs_log_warn("ZS_API_KEY is set and unused: --api-key-file %s holds the keys", key_file);

    zs_server_opts so;
    memset(&so, 0, sizeof so);
    so.http.host = host;
    so.http.port = port;
    so.http.threads = threads;
    so.http.max_body_bytes = (size_t)max_body;
    so.http.api_key = api_key && *api_key ? api_key : NULL;
    so.http.key_file = key_file;
    so.http.tls_cert = tls_cert && *tls_cert ? tls_cert : NULL;
    so.http.tls_key = tls_key && *tls_key ? tls_key : NULL;
    so.http.allowed_origins = origins;
    zs_engine_opts_default(&so.engine);
    so.engine.max_seqs = max_seqs;
    so.engine.max_batch_tokens = max_batch;
    ZS_CHECK(zs_engine_flags_apply(&ef, &so.engine));
    so.train_config = &ef.ds;
    so.engine.model.embed_lookup = 1; /* as zs_server_start sets it: the followers open the same layout */
    so.sched.max_seqs = max_seqs;
    so.sched.max_batch_tokens = max_batch;
    so.sched.max_queue = max_queue;
    so.sched.no_prefix_cache = no_prefix_cache;
    so.sched.train_share = tso.train_share;
    so.sched.train_slice_ms = tso.train_slice_ms;
    if (strcmp(train_fuse, "on") && strcmp(train_fuse, "off"))
        return zs_err(ZS_EINVAL, "--train-fuse must be on or off (got '%s')", train_fuse);
    so.sched.train_no_fuse = !strcmp(train_fuse, "off");
    if (spec_tokens < 0 || spec_tokens > ZS_SPEC_MAX_TOKENS)
        return zs_err(ZS_ERANGE, "--spec-tokens must be between 0 and %d (got %d)", ZS_SPEC_MAX_TOKENS, spec_tokens);
    if (strcmp(spec_tree, "on") && strcmp(spec_tree, "off"))
        return zs_err(ZS_EINVAL, "--spec-tree must be on or off (got '%s')", spec_tree);
    so.sched.spec_tokens = spec_tokens;
    /* default off: with --speculative ngram and 8 drafts per sequence on copying prompts (CPU),
     * trees gained nothing measurable in tokens per pass: SmolLM2-135M greedy 2.118 both (the same
     * bits), T=0.8 over 8 seeds 1.366 against 1.363; stories260K greedy 1.330 both, T=1 1.079
     * against 1.066. Copied text mostly has one continuation, so a tree is a chain, and its side
     * branches take rows from the main one. On is for text with several likely continuations
     * (the draft model proposes chains only). */
    so.sched.spec_tree = !strcmp(spec_tree, "on");
    so.speculative = speculative;
    so.draft_model = draft_model;
    so.draft_weight_dtype = draft_dtype;
    const char *kind;
    ZS_CHECK(spec_kind(&so, &kind)); /* before anything starts */
    /* both shape a proposer's drafts: without one they would be accepted and do nothing */
    if (spec_tokens && !strcmp(kind, "none"))
        return zs_err(ZS_EINVAL, "--spec-tokens %d needs --speculative ngram or --draft-model PATH", spec_tokens);
    if (so.sched.spec_tree && strcmp(kind, "ngram"))
        return zs_err(ZS_EINVAL, "--spec-tree on needs --speculative ngram (%s)",
                      strcmp(kind, "none") ? "the draft model proposes chains only" : "no drafts without it");
    if (draft_dtype) {
        zs_model_opts mo;
        ZS_CHECK(zs_engine_flags_weight_dtype("--draft-weight-dtype", draft_dtype, &mo));
    }
    if (draft_model) { /* what zs_spec_draft_new refuses, said before the model loads */
        int dev = ZS_DEVICE_CPU;
        if (zs_device_resolve(so.engine.device, &dev) == 0 && dev == ZS_DEVICE_CUDA)
            return zs_err(ZS_EUNSUPPORTED, "--draft-model %s: not supported with a target on a CUDA device (the draft "
                          "model runs on the CPU device only); serve with --device cpu, or use --speculative ngram",
                          draft_model);
    }
    so.model_name = name;
    so.chat_template = tmpl;
    so.data_dir = data_dir;
    so.max_file_bytes = (size_t)(max_file ? max_file : max_body);
    so.loras = loras;
    so.n_loras = lora_list.n;
    so.lora_dirs = lora_dirs;
    so.n_lora_dirs = lora_dir_list.n;
    if (zs_cluster_follower()) return follow(&so.engine);

    /* every thread started from here inherits the blocked set; only sigwait takes them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGHUP);
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, &set, &old);
    signal(SIGPIPE, SIG_IGN);

    zs_server *s = NULL;
    if (zs_cluster_size() > 1) ZS_CHECK(zs_cluster_on_lost(on_lost_cmd, NULL));
    int rc = zs_server_start(&so, on_loaded_cmd, NULL, &s);
    if (rc < 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return rc;
    }
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        if (sig == SIGHUP) { /* the key file again; a bad one keeps the keys in force */
            int n = zs_http_reload_keys(s->http);
            if (n < 0) fprintf(stderr, "zeroserve: SIGHUP: %s; the keys in force stay\n", zs_errmsg());
            else fprintf(stderr, "zeroserve: SIGHUP: %d keys from %s\n", n, key_file);
            continue;
        }
        char lost[512];
        if (sig == SIGUSR1 && zs_cluster_lost(lost, sizeof lost)) {
            /* requests get 503 naming the lost process for a moment (clients and load
             * balancers see why), then the process exits non-zero: the world cannot heal */
            fprintf(stderr, "zeroserve: the multi-process world is lost: %s; answering 503 for %d s, then exiting\n", lost, LOST_GRACE_S);
            sleep(LOST_GRACE_S);
            zs_server_stop(s, 1.0);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            return zs_err(ZS_ECANCELLED, "the multi-process world is lost: %s", lost);
        }
        if (sig == SIGUSR1) {
            rc = zs_server_wait_loaded(s, 0);
            if (rc == ZS_EBUSY || rc == 0) continue; /* not from the loader */
            char msg[600];
            snprintf(msg, sizeof msg, "%s", zs_errmsg());
            zs_server_stop(s, 0);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            return zs_err(rc, "cannot load the model: %s", msg);
        }
        fprintf(stderr, "zeroserve: %s received, draining (up to 10 s) and stopping\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        break;
    }
    zs_server_stop(s, 10.0);
    fprintf(stderr, "zeroserve: stopped\n");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return 0;
}

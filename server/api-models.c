/* api-models.c — the models an api object serves: the base model (attached once it has
 * loaded), the fine-tuned models added while serving, and the LoRA adapters served over the
 * base (loaded at start-up by `serve --lora`, at run time by POST /v1/load_lora_adapter, or by a
 * succeeded LoRA job), looked up by name. The model list only grows until zs_api_free, so a
 * model pointer stays valid while requests use it; adapters are reference counted (see
 * api-models.h) so that unloading one never frees what a request still uses. Run-time loading
 * over HTTP is confined to the --lora-dir directories (zs_api_lora_path). */
#include "api-models.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "chat.h"
#include "cluster.h"
#include "common.h"
#include "device.h"
#include "engine.h"

/* (mu held) */
static const zs_api_model *model_find_locked(zs_api *a, const char *name) {
    if (!name || !strcmp(name, a->base.model_name)) return &a->base; /* listed before it is loaded; requests check base.sched */
    for (const zs_api_model *x = a->extra; x; x = x->next)
        if (!strcmp(name, x->model_name)) return x;
    return NULL;
}

/* (mu held) */
static zs_api_adapter *adapter_find_locked(zs_api *a, const char *name) {
    for (zs_api_adapter *x = a->adapters; x && name; x = x->next)
        if (!strcmp(name, x->name)) return x;
    return NULL;
}

const zs_api_model *zs_api_model_find(zs_api *a, const char *name) {
    pthread_mutex_lock(&a->mu);
    const zs_api_model *m = model_find_locked(a, name);
    pthread_mutex_unlock(&a->mu);
    return m;
}

int zs_api_name_taken(zs_api *a, const char *name) {
    pthread_mutex_lock(&a->mu);
    int taken = model_find_locked(a, name) || adapter_find_locked(a, name);
    pthread_mutex_unlock(&a->mu);
    return taken;
}

int zs_api_resolve(zs_api *a, const char *name, const zs_key_id *who, const zs_api_model **m, zs_api_adapter **ad) {
    *m = NULL;
    *ad = NULL;
    pthread_mutex_lock(&a->mu);
    const zs_api_model *x = model_find_locked(a, name);
    zs_api_adapter *y = x ? NULL : adapter_find_locked(a, name);
    if (x && !zs_key_sees(who, x->owner)) x = NULL; /* another tenant's: as if there were none */
    if (y && !zs_key_sees(who, y->owner)) y = NULL;
    if (y) {
        y->refs++;
        x = &a->base;
    }
    pthread_mutex_unlock(&a->mu);
    *m = x;
    *ad = y;
    return x ? 0 : ZS_ENOTFOUND;
}

static void adapter_free(zs_api_adapter *ad) {
    zs_lora_free(ad->lora);
    free(ad->owner);
    free(ad->name);
    free(ad->dir);
    free(ad);
}

void zs_api_adapter_release(zs_api *a, zs_api_adapter *ad) {
    if (!ad) return;
    pthread_mutex_lock(&a->mu);
    int last = --ad->refs == 0 && ad->removed && !ad->waiting;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (last) {
        zs_log_info("api: adapter '%s' freed", ad->name);
        adapter_free(ad);
    }
}

/* Fills m's engine-derived fields (m->mu-free: called before m is visible to requests). */
static void model_fill(zs_api_model *m, zs_engine *e, zs_sched *s) {
    zs_tokenizer *t = zs_engine_tokenizer(e);
    int bos = zs_tokenizer_bos(t), eos = zs_tokenizer_eos(t);
    const char *bp = bos >= 0 ? zs_tokenizer_piece(t, bos) : NULL;
    const char *ep = eos >= 0 ? zs_tokenizer_piece(t, eos) : NULL;
    /* the reference token for zs_api_token_text: a plain letter */
    int32_t *ids = NULL;
    size_t n = 0;
    int ref = -1;
    char *ref_text = NULL;
    if (zs_tokenizer_encode(t, "a", 1, 0, &ids, &n) == 0 && n == 1 &&
        zs_tokenizer_decode(t, ids, 1, 0, &ref_text) == 0 && ref_text[0])
        ref = ids[0];
    free(ids);
    if (ref < 0) {
        free(ref_text);
        ref_text = NULL;
    }
    m->tok = t;
    m->context = zs_engine_context(e);
    m->vocab = zs_tokenizer_vocab_size(t);
    m->bos = bp ? strdup(bp) : NULL;
    m->eos = ep ? strdup(ep) : NULL;
    m->ref_tok = ref;
    m->ref_text = ref_text;
    m->engine = e;
    m->sched = s;
}

void zs_api_attach(zs_api *a, zs_engine *e, zs_sched *s) {
    zs_api_model m = a->base;
    model_fill(&m, e, s);
    pthread_mutex_lock(&a->mu);
    a->base = m;
    pthread_mutex_unlock(&a->mu);
    zs_log_info("api: serving '%s' (context %d, chat template %s)", m.model_name, m.context,
                zs_chat_template_name(m.tmpl));
}

int zs_api_add_model(zs_api *a, const char *name, const char *owner, const char *model_dir, zs_engine *e,
                     zs_sched *s) {
    if (!a || !name || !e || !s) return zs_err(ZS_EINVAL, "api: bad arguments");
    if (zs_api_name_taken(a, name)) return zs_err(ZS_EINVAL, "api: the model '%s' is already served", name);
    zs_api_model *m = calloc(1, sizeof *m);
    if (!m || !(m->model_name = strdup(name)) || (owner && *owner && !(m->owner = strdup(owner)))) {
        if (m) free(m->model_name);
        free(m);
        return zs_err(ZS_ENOMEM, "api: out of memory");
    }
    m->tmpl = zs_model_chat_template_detect(model_dir);
    m->created = (long)time(NULL);
    model_fill(m, e, s);
    pthread_mutex_lock(&a->mu);
    m->next = a->extra;
    a->extra = m;
    pthread_mutex_unlock(&a->mu);
    zs_log_info("api: serving '%s' (context %d, chat template %s)", m->model_name, m->context,
                zs_chat_template_name(m->tmpl));
    return 0;
}

/* ------------------------------------------------------------------ LoRA adapters */

static int add_adapter(zs_api *a, const char *name, const char *owner, const char *dir, zs_lora *l, int need_base);

int zs_api_add_adapter(zs_api *a, const char *name, const char *dir, zs_lora *l) {
    return add_adapter(a, name, NULL, dir, l, 1);
}

int zs_api_preload_adapter(zs_api *a, const char *name, const char *dir, zs_lora *l) {
    return add_adapter(a, name, NULL, dir, l, 0);
}

static int add_adapter(zs_api *a, const char *name, const char *owner, const char *dir, zs_lora *l, int need_base) {
    if (!a || !name || !l) {
        zs_lora_free(l);
        return zs_err(ZS_EINVAL, "api: bad arguments");
    }
    if (!*name) {
        zs_lora_free(l);
        return zs_err(ZS_EINVAL, "api: an adapter needs a non-empty name");
    }
    zs_api_adapter *ad = calloc(1, sizeof *ad);
    if (ad) {
        ad->name = strdup(name);
        ad->dir = strdup(dir ? dir : "");
        ad->owner = owner && *owner ? strdup(owner) : NULL;
    }
    if (!ad || !ad->name || !ad->dir || (owner && *owner && !ad->owner)) {
        if (ad) {
            free(ad->name);
            free(ad->dir);
            free(ad->owner);
        }
        free(ad);
        zs_lora_free(l);
        return zs_err(ZS_ENOMEM, "api: out of memory");
    }
    ad->lora = l;
    ad->created = (long)time(NULL);
    ad->refs = 1; /* the table's */
    int rc = 0;
    pthread_mutex_lock(&a->mu);
    if (need_base && !a->base.sched)
        rc = zs_err(ZS_EBUSY, "api: the base model is still loading; adapters are served once it has loaded");
    else if (model_find_locked(a, name) || adapter_find_locked(a, name))
        rc = zs_err(ZS_EINVAL, "api: the name '%s' is already served (a model or an adapter)", name);
    if (rc == 0) {
        ad->next = a->adapters;
        a->adapters = ad;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc < 0) {
        adapter_free(ad);
        return rc;
    }
    const zs_lora_params *p = zs_lora_get_params(l);
    zs_log_info("api: serving adapter '%s' from %s over '%s' (r %d, alpha %g, %zu parameters)", name, ad->dir,
                a->base.model_name, p->r, (double)p->alpha, zs_lora_param_count(l));
    return 0;
}

int zs_api_load_adapter(zs_api *a, const char *name, const char *owner, const char *dir) {
    if (!a || !name || !dir) return zs_err(ZS_EINVAL, "api: bad arguments");
    if (!*name) return zs_err(ZS_EINVAL, "api: an adapter needs a non-empty name");
    if (!*dir) return zs_err(ZS_EINVAL, "api: the adapter '%s' needs a directory", name);
    pthread_mutex_lock(&a->mu);
    zs_engine *e = a->base.sched ? a->base.engine : NULL;
    int taken = model_find_locked(a, name) || adapter_find_locked(a, name);
    pthread_mutex_unlock(&a->mu);
    if (!e) return zs_err(ZS_EBUSY, "api: the base model is still loading; adapters are served once it has loaded");
    if (taken) return zs_err(ZS_EINVAL, "api: the name '%s' is already served (a model or an adapter)", name);
    zs_lora *l = NULL;
    int rc = zs_api_adapter_open(e, dir, &l);
    if (rc < 0) return rc;
    return add_adapter(a, name, owner, dir, l, 1);
}

int zs_api_adapter_open(zs_engine *e, const char *dir, zs_lora **out) {
    if (zs_cluster_size() > 1) /* the followers' ranks would need the adapter too */
        return zs_err(ZS_EUNSUPPORTED, "%s: LoRA adapters are not served by a multi-process world yet", dir);
    if (zs_engine_device(e) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "%s: LoRA adapters are not served on the CUDA device yet (serve with --device cpu)",
                      dir);
    zs_lora *l = NULL;
    int rc = zs_lora_load(dir, zs_engine_model(e), &l);
    if (rc == 0 && (rc = zs_lora_freeze(l, zs_lora_serving_bf16(zs_engine_model(e)))) < 0) zs_lora_free(l); /* read-only from now on: the serving copy */
    if (rc < 0) return rc;
    *out = l;
    return 0;
}

/* Waits on a->cv for up to s seconds (mu held). */
static void timed_wait_locked(zs_api *a, double s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + s;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&a->cv, &a->mu, &ts);
}

/* How long an unload waits for the failed requests to finish before leaving the adapter to the
 * last of them (their answers may still be flushing to slow clients). */
#define UNLOAD_DRAIN_S 30.0

int zs_api_unload_adapter(zs_api *a, const char *name, double wait_s, int *n_failed) {
    if (n_failed) *n_failed = 0;
    if (!a || !name) return zs_err(ZS_EINVAL, "api: bad arguments");
    pthread_mutex_lock(&a->mu);
    zs_api_adapter **pp = &a->adapters;
    while (*pp && strcmp((*pp)->name, name)) pp = &(*pp)->next;
    zs_api_adapter *ad = *pp;
    if (!ad) {
        pthread_mutex_unlock(&a->mu);
        return zs_err(ZS_ENOTFOUND, "api: no adapter named '%s' is served", name);
    }
    *pp = ad->next; /* requests naming it get 404 from now on */
    ad->next = NULL;
    ad->removed = 1;
    ad->waiting = 1;
    ad->refs--; /* the table's */
    zs_sched *s = a->base.sched;
    double t0 = zs_now(), end = t0 + (wait_s > 0 ? wait_s : 0);
    while (ad->refs > 0 && zs_now() < end && !a->draining) timed_wait_locked(a, ZS_MIN(0.1, end - zs_now()));
    int failed = 0;
    if (ad->refs > 0 && s) {
        /* fail what is left; a request submitted after a fail_lora call (it resolved the name
         * before the unload) is failed by the next one */
        double drain_end = zs_now() + UNLOAD_DRAIN_S, next_fail = 0;
        char msg[600];
        snprintf(msg, sizeof msg, "the LoRA adapter '%s' was unloaded", name);
        while (ad->refs > 0 && zs_now() < drain_end) {
            if (zs_now() >= next_fail) {
                pthread_mutex_unlock(&a->mu);
                failed += zs_sched_fail_lora(s, ad->lora, msg);
                pthread_mutex_lock(&a->mu);
                next_fail = zs_now() + 0.5;
            }
            if (ad->refs > 0) timed_wait_locked(a, 0.05);
        }
    }
    ad->waiting = 0;
    int left = ad->refs;
    pthread_mutex_unlock(&a->mu);
    if (n_failed) *n_failed = failed;
    if (left == 0) {
        zs_log_info("api: adapter '%s' unloaded (%d request(s) failed, %.1f s)", name, failed, zs_now() - t0);
        adapter_free(ad);
    } else {
        zs_log_warn("api: adapter '%s' unloaded; %d request(s) still finish their answers, it is freed after the last",
                    name, left);
    }
    return 0;
}

void zs_api_adapters_free(zs_api *a) {
    for (zs_api_adapter *x = a->adapters, *next; x; x = next) {
        next = x->next;
        adapter_free(x);
    }
    a->adapters = NULL;
}

/* ------------------------------------------------------------------ --lora-dir */

int zs_api_set_lora_dirs(zs_api *a, const char *const *dirs, int n) {
    if (n <= 0) return 0;
    a->lora_dirs = calloc((size_t)n, sizeof *a->lora_dirs);
    if (!a->lora_dirs) return zs_err(ZS_ENOMEM, "api: out of memory");
    for (int i = 0; i < n; i++) {
        const char *d = dirs[i] ? dirs[i] : "";
        struct stat st;
        char *rp = *d ? realpath(d, NULL) : NULL;
        if (!rp) {
            int err = *d ? errno : ENOENT;
            return zs_err(err == ENOENT ? ZS_ENOTFOUND : ZS_EINVAL, "--lora-dir '%s': %s", d, strerror(err));
        }
        a->lora_dirs[a->n_lora_dirs++] = rp;
        if (stat(rp, &st) != 0 || !S_ISDIR(st.st_mode))
            return zs_err(ZS_EINVAL, "--lora-dir '%s': not a directory", d);
    }
    return 0;
}

void zs_api_lora_dirs_free(zs_api *a) {
    for (int i = 0; i < a->n_lora_dirs; i++) free(a->lora_dirs[i]);
    free(a->lora_dirs);
    a->lora_dirs = NULL;
    a->n_lora_dirs = 0;
}

/* Whether the real path p is one of the --lora-dir directories or inside one. */
static int under_lora_dir(const zs_api *a, const char *p) {
    for (int i = 0; i < a->n_lora_dirs; i++) {
        const char *d = a->lora_dirs[i];
        size_t n = strlen(d);
        if (n == 1 && d[0] == '/') return p[0] == '/';
        if (!strncmp(p, d, n) && (p[n] == '\0' || p[n] == '/')) return 1;
    }
    return 0;
}

/* Whether the candidate directory c (a path of at most PATH_MAX - 1 bytes) is an allowed one:
 * its real path into real (PATH_MAX bytes) and inside a --lora-dir, and the loader's files in it,
 * where they exist (even as dangling links), too. */
static int lora_candidate(const zs_api *a, const char *c, char *real) {
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    if (!realpath(c, real) || !under_lora_dir(a, real)) return 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char f[PATH_MAX], fr[PATH_MAX];
        struct stat st;
        if (snprintf(f, sizeof f, "%s/%s", real, files[i]) >= (int)sizeof f) return 0;
        if (lstat(f, &st) != 0) {
            if (errno == ENOENT) continue; /* the loader says it is missing: a problem inside */
            return 0;
        }
        if (!realpath(f, fr) || !under_lora_dir(a, fr)) return 0;
    }
    return 1;
}

int zs_api_lora_path(zs_api *a, const char *path, size_t len, char **out) {
    if (!a || !path || !out || !a->n_lora_dirs) return ZS_EPERM;
    if (!len || len >= PATH_MAX || memchr(path, '\0', len)) return ZS_EPERM;
    for (const char *p = path; *p;) { /* no ".." component, even one that would stay inside */
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return ZS_EPERM;
        p += n;
        while (*p == '/') p++;
    }
    char c[PATH_MAX], real[PATH_MAX];
    for (int i = 0; i < (path[0] == '/' ? 1 : a->n_lora_dirs); i++) {
        if (path[0] == '/') snprintf(c, sizeof c, "%s", path);
        else if (snprintf(c, sizeof c, "%s/%s", a->lora_dirs[i], path) >= (int)sizeof c) continue;
        if (lora_candidate(a, c, real)) {
            *out = strdup(real);
            return *out ? 0 : ZS_ENOMEM;
        }
    }
    return ZS_EPERM;
}

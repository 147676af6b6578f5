/* api-models.c — the models an api object serves: the base model (attached once it has
 * loaded) and the fine-tuned models added while serving, looked up by name. The list only
 * grows until zs_api_free, so a model pointer stays valid while requests use it. */
#include "api-models.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "common.h"
#include "engine.h"

const zs_api_model *zs_api_model_find(zs_api *a, const char *name) {
    const zs_api_model *m = NULL;
    pthread_mutex_lock(&a->mu);
    if (!name || !strcmp(name, a->base.model_name)) {
        m = &a->base; /* listed before it is loaded; requests check base.sched */
    } else {
        for (const zs_api_model *x = a->extra; x; x = x->next)
            if (!strcmp(name, x->model_name)) m = x;
    }
    pthread_mutex_unlock(&a->mu);
    return m;
}

/* Fills m's engine-derived fields (m->mu-free: called before m is visible to requests). */
static void model_fill(zs_api_model *m, zs_engine *e, zs_sched *s) {
    zs_tokenizer *t = zs_engine_tokenizer(e);
    int bos = zs_tokenizer_bos(t), eos = zs_tokenizer_eos(t);
    const char *bp = bos >= 0 ? zs_tokenizer_piece(t, bos) : NULL;
    const char *ep = eos >= 0 ? zs_tokenizer_piece(t, eos) : NULL;
    /* the reference token for token_text: a plain letter */
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

int zs_api_add_model(zs_api *a, const char *name, const char *model_dir, zs_engine *e, zs_sched *s) {
    if (!a || !name || !e || !s) return zs_err(ZS_EINVAL, "api: bad arguments");
    if (zs_api_model_find(a, name)) return zs_err(ZS_EINVAL, "api: the model '%s' is already served", name);
    zs_api_model *m = calloc(1, sizeof *m);
    if (!m || !(m->model_name = strdup(name))) {
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


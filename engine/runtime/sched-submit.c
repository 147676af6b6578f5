/* sched-submit.c — a scheduler request made from its zs_req_params at zs_sched_submit, on the
 * caller's thread: the parameters validated (prompt and max_tokens within the context, token ids,
 * sampling parameters, top_logprobs, the adapter, an embedding request's and a constraint's own
 * checks; the error names the field), then the request's own state: a copy of the prompt, its
 * sampler, detokenizer and stop strings, its constraint's state, its pooling sums, its prefix
 * blocks' hashes. Queueing it is sched.c's. Reads only what zs_sched_new set (thread-safe). */
#include <string.h>

#include "common.h"
#include "device.h"
#include "lora.h"
#include "sched-impl.h"

/* A request's adapter: refused on the CUDA device (not computed there yet) and when it is not of
 * the served model's shape (it would fail the whole step it joined). */
static int check_lora(zs_sched *s, const zs_lora *l) {
    if (zs_engine_device(s->e) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "lora: LoRA adapters are not supported on the CUDA device yet (serve with "
                      "--device cpu to use them)");
    return zs_lora_check_base(l, zs_engine_model(s->e));
}

/* Validates p (the error names the field). */
static int check_params(zs_sched *s, const zs_req_params *p) {
    if (p->embed) ZS_CHECK(zs_sched_embed_check(s, p));
    else if (p->n_prompt < 1) return zs_err(ZS_EINVAL, "prompt: the prompt is empty");
    if (!p->embed && p->max_tokens < 1) return zs_err(ZS_ERANGE, "max_tokens: must be at least 1");
    if (!p->embed && (long)p->n_prompt + p->max_tokens > s->context)
        return zs_err(ZS_ERANGE, "max_tokens: the prompt (%d tokens) plus max_tokens (%d) exceeds the context length of %d tokens",
                      p->n_prompt, p->max_tokens, s->context);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
            return zs_err(ZS_ERANGE, "prompt: token id %d is out of range [0, %d)", p->prompt[i], s->vocab);
    if (!p->embed && p->top_logprobs > 20) return zs_err(ZS_ERANGE, "top_logprobs: must be at most 20");
    if (!p->embed) ZS_CHECK(zs_sampler_params_check(&p->sampling));
    if (p->lora) ZS_CHECK(check_lora(s, p->lora));
    if (p->constraint) ZS_CHECK(zs_sched_con_check(s, p));
    return 0;
}

/* A new request from p: its own copies, sampler, detokenizer, stop strings, constraint state,
 * pooling sums and prefix hashes. */
static int req_new(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out) {
    zs_request *r = calloc(1, sizeof *r);
    if (!r) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = 0;
    /* the generated tokens follow the prompt (the prompt lookup proposer reads both) */
    r->prompt = malloc(((size_t)p->n_prompt + (p->embed ? 0 : (size_t)p->max_tokens)) * sizeof(int32_t));
    if (!r->prompt) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) {
        memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
        if (p->embed) rc = zs_sched_embed_init(s, r);
        else rc = zs_sampler_new(&p->sampling, s->vocab, &r->smp);
    }
    if (rc == 0 && !p->embed) rc = zs_engine_detok_for(s->e, p->prompt, p->n_prompt, &r->dt);
    if (rc == 0 && !p->embed && p->n_stop > 0) rc = zs_stop_new(p->stop, p->n_stop, &r->st);
    if (rc == 0 && p->constraint) rc = zs_sched_con_init(s, r, p->constraint);
    if (rc == 0) rc = zs_sched_prefix_hash(s, r, p);
    if (rc < 0) {
        zs_sreq_free(r);
        return rc;
    }
    r->n_prompt = p->n_prompt;
    r->n_ctx = p->n_prompt;
    r->max_tokens = p->embed ? 0 : p->max_tokens;
    r->embed = p->embed != 0;
    r->pooling = p->pooling;
    r->top_logprobs = p->top_logprobs;
    r->ignore_eos = p->ignore_eos;
    r->n_end_ids = ZS_MIN(ZS_MAX(p->n_end_ids, 0), ZS_REQ_MAX_END_IDS);
    memcpy(r->end_ids, p->end_ids, (size_t)r->n_end_ids * sizeof(int32_t));
    r->sink = *sink;
    r->lora = p->lora;
    r->t_submit = zs_now();
    *out = r;
    return 0;
}

int zs_sched_req_new(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out) {
    ZS_CHECK(check_params(s, p));
    return req_new(s, p, sink, out);
}

/* sched-embed.c — embedding requests of the scheduler (zs_req_params.embed 1): the prompt is
 * prefilled in the continuous batch like any prompt (chunked, beside decode tokens), and the
 * final-normed hidden state of each of its tokens (zs_batch.hidden) is pooled here as it comes
 * (pooling ZS_POOL_MEAN: the mean over the prompt's tokens, summed in position order in double;
 * ZS_POOL_LAST: the last token's row); nothing is sampled. The request ends with
 * sink.on_embedding(pooled, dim) and then on_done(ZS_DONE_STOP, n_generated 0). max_tokens,
 * sampling, stop and logprobs are ignored. The pooled vector is the same bits alone or batched
 * with anything (the forward is batch-invariant, and the sum's order does not depend on how the
 * prompt was chunked). Embedding requests neither use nor fill the prefix cache. Refused on the
 * CUDA device. Engine thread, except the check and init at submit. */
#include "common.h"
#include "device.h"
#include "sched-impl.h"

/* An embedding request: its prompt within the context, known pooling, the CUDA device refused
 * (its adapter is checked by sched-submit.c). */
int zs_sched_embed_check(zs_sched *s, const zs_req_params *p) {
    if (p->n_prompt < 1) return zs_err(ZS_EINVAL, "input: the input is empty");
    if (p->n_prompt > s->context)
        return zs_err(ZS_ERANGE, "input: %d tokens exceed the context length of %d tokens", p->n_prompt, s->context);
    if (p->pooling != ZS_POOL_MEAN && p->pooling != ZS_POOL_LAST)
        return zs_err(ZS_EINVAL, "pooling: unknown pooling %d", p->pooling);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
            return zs_err(ZS_ERANGE, "input: token id %d is out of range [0, %d)", p->prompt[i], s->vocab);
    if (zs_engine_device(s->e) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "embeddings run on the CPU device for now (serve with --device cpu)");
    return 0;
}

int zs_sched_embed_init(zs_sched *s, zs_request *r) {
    r->acc = calloc((size_t)s->dim, sizeof(double));
    return r->acc ? 0 : zs_err(ZS_ENOMEM, "out of memory");
}

/* One hidden row of an embedding request, in position order (r->n_done: its position). */
void zs_sched_embed_row(zs_sched *s, zs_request *r, const float *h) {
    if (r->pooling == ZS_POOL_LAST) {
        if (r->n_done == r->n_prompt - 1)
            for (int t = 0; t < s->dim; t++) r->acc[t] = h[t];
        return;
    }
    for (int t = 0; t < s->dim; t++) r->acc[t] += h[t];
}

/* An embedding request has all its rows: the pooled vector to the sink, then done. */
void zs_sched_embed_finish(zs_sched *s, zs_request *r) {
    float *v = malloc((size_t)s->dim * sizeof(float));
    if (!v) {
        zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, ZS_ENOMEM, "out of memory");
        return;
    }
    double div = r->pooling == ZS_POOL_MEAN ? (double)r->n_prompt : 1.0;
    for (int t = 0; t < s->dim; t++) v[t] = (float)(r->acc[t] / div);
    if (r->sink.on_embedding) r->sink.on_embedding(r->sink.ud, v, s->dim);
    free(v);
    zs_sreq_finish(s, r, ZS_DONE_STOP, "", 0, 0, NULL);
}

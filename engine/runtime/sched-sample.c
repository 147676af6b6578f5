/* sched-sample.c — what happens to one logits row of a generating request: its token (sampled,
 * or for a constrained request taken from sched-constrain.c), its logprobs, its text (the
 * detokenizer holds back an incomplete UTF-8 character, the stop strings hold back what may
 * become a stop string), the sink's on_token, and the request's end: EOS or one of its end ids
 * (unless ignore_eos; end ids are a chat template's end-of-turn tokens, so that a model whose
 * generation_config lists only <eos> still stops at the end of its turn), a stop string, the
 * grammar done, or max_tokens. At a normal end the held-back text is flushed through the stop
 * strings and handed to on_done. A row that verifies draft tokens (the children of its node in
 * the step's draft tree; one for a chain) takes the speculative rule (zs_sampler_verify_multi):
 * one of them is accepted or the token is drawn so that its distribution is the target's;
 * greedy, the argmax as plain decoding picks it. Engine thread. */
#include <string.h>

#include "common.h"
#include "sched-impl.h"

/* Ends r normally (ZS_DONE_STOP or ZS_DONE_LENGTH): the held-back text goes to on_done; a stop
 * string found in it makes the end ZS_DONE_STOP. */
static void end(zs_sched *s, zs_request *r, int reason) {
    char held[512], tail[2048];
    size_t a = 0, n = 0;
    int stopped = 0;
    if (zs_detok_flush(r->dt, held, sizeof held, &a) < 0) a = 0;
    if (!r->st) {
        memcpy(tail, held, a);
        n = a;
    } else if (zs_stop_push(r->st, held, a, tail, sizeof tail, &n, &stopped) == 0) {
        size_t c = 0;
        if (stopped) reason = ZS_DONE_STOP;
        else if (zs_stop_flush(r->st, tail + n, sizeof tail - n, &c) == 0) n += c;
    }
    zs_sreq_finish(s, r, reason, tail, n, 0, NULL);
}

static void fail(zs_sched *s, zs_request *r, int rc) { zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, rc, zs_errmsg()); }

int zs_sched_sample(zs_sched *s, zs_request *r, const float *logits, const int32_t *drafts, int nd, int *which) {
    zs_tokenizer *tk = zs_engine_tokenizer(s->e);
    int tok, w = -1;
    float lp = 0;
    int con_end = 0, constrained = r->has_con && r->phase != PH_TRIGGER;
    int rc;
    if (which) *which = -1;
    if (r->has_con) {
        rc = zs_sched_con_sample(s, r, logits, drafts, nd, &tok, &w, &lp, &logits, &con_end);
        /* an EOS the grammar allowed: the value is complete, the EOS is not output */
        if (rc == 0 && con_end && constrained && r->phase == PH_VALUE && zs_tokenizer_is_eos(tk, tok)) {
            end(s, r, ZS_DONE_STOP);
            return -1;
        }
    } else if (nd > 0) {
        rc = zs_sampler_verify_multi(r->smp, logits, drafts, nd, &tok, &w, r->top_logprobs >= 0 ? &lp : NULL);
    } else {
        rc = zs_sampler_sample(r->smp, logits, &tok, r->top_logprobs >= 0 ? &lp : NULL);
    }
    if (rc < 0) {
        fail(s, r, rc);
        return -1;
    }
    zs_sreq_count_token(s, r);
    int eos = zs_tokenizer_is_eos(tk, tok);
    for (int i = 0; i < r->n_end_ids && !eos; i++) eos = tok == r->end_ids[i];
    if (!r->ignore_eos && eos && !constrained) {
        end(s, r, ZS_DONE_STOP);
        return -1;
    }
    r->prompt[r->n_prompt + r->n_gen] = tok;
    r->n_gen++;
    char txt[512], out[1024];
    size_t n = 0, m = 0;
    rc = zs_detok_push(r->dt, tok, txt, sizeof txt, &n);
    int stopped = 0;
    if (rc == 0 && r->st) {
        rc = zs_stop_push(r->st, txt, n, out, sizeof out, &m, &stopped);
    } else if (rc == 0) {
        memcpy(out, txt, n);
        m = n;
    }
    if (rc < 0) {
        fail(s, r, rc);
        return -1;
    }
    int k = r->top_logprobs > 0 ? r->top_logprobs : 0;
    if (k > 0 && zs_sampler_top_logprobs(logits, s->vocab, k, s->top_ids, s->top_lps) < 0) k = 0;
    r->sink.on_token(r->sink.ud, tok, out, m, lp, s->top_ids, s->top_lps, k);
    if (stopped) {
        zs_sreq_finish(s, r, ZS_DONE_STOP, "", 0, 0, NULL); /* the rest is cut off */
        return -1;
    }
    if (con_end) {
        end(s, r, ZS_DONE_STOP);
        return -1;
    }
    if (r->n_gen >= r->max_tokens) {
        end(s, r, ZS_DONE_LENGTH);
        return -1;
    }
    r->last_tok = tok;
    if (which) *which = w;
    return w >= 0 ? 1 : 0;
}

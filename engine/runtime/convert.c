/* convert.c — Hugging Face directory -> GGUF file: the plan and the vocabulary first, then the
 * writer; plus the vocabulary's tokenizer.* keys (the writing side of engine.c's GGUF tokenizer
 * glue: engine/text never sees GGUF). See convert.h. */
#include "convert.h"

#include "common.h"

int zs_convert_put_vocab(zs_gguf_writer *w, const zs_tok_export *e) {
    const zs_tokenizer_spec *s = &e->spec;
    size_t n = (size_t)s->n_vocab;
    ZS_CHECK(zs_gguf_writer_kv_str(w, "tokenizer.ggml.model", e->model));
    if (s->pre) ZS_CHECK(zs_gguf_writer_kv_str(w, "tokenizer.ggml.pre", s->pre));
    ZS_CHECK(zs_gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", s->tokens, s->token_len, n));
    if (s->scores) ZS_CHECK(zs_gguf_writer_kv_arr(w, "tokenizer.ggml.scores", ZS_GGUF_F32, s->scores, n));
    ZS_CHECK(zs_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", ZS_GGUF_I32, s->types, n));
    if (s->kind == ZS_TOK_SPEC_BPE) /* llama.cpp wants the key even when there are no merges */
        ZS_CHECK(zs_gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", s->merges, s->merge_len, s->n_merges));
    if (s->bos >= 0) ZS_CHECK(zs_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)s->bos));
    if (s->eos >= 0) ZS_CHECK(zs_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s->eos));
    if (s->unk >= 0) ZS_CHECK(zs_gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)s->unk));
    if (e->pad >= 0) ZS_CHECK(zs_gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)e->pad));
    ZS_CHECK(zs_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", s->add_bos > 0));
    ZS_CHECK(zs_gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", s->add_eos > 0));
    if (s->kind == ZS_TOK_SPEC_SPM)
        ZS_CHECK(zs_gguf_writer_kv_bool(w, "tokenizer.ggml.add_space_prefix", s->add_space_prefix != 0));
    if (e->chat_template) ZS_CHECK(zs_gguf_writer_kv_str(w, "tokenizer.chat_template", e->chat_template));
    return 0;
}

int zs_convert_run(const zs_convert_opts *o, zs_convert_result *res) {
    if (!o || !o->model_dir || !o->out_path) return zs_err(ZS_EINVAL, "zs_convert_run: NULL argument");
    zs_gguf_conv *c = NULL;
    zs_tok_export *e = NULL;
    zs_gguf_writer *w = NULL;
    ZS_CHECK(zs_gguf_conv_open(o->model_dir, o->ftype, &c));
    int rc = zs_tokenizer_export(o->model_dir, zs_gguf_conv_config(c)->vocab_size, &e);
    if (rc == 0) rc = zs_gguf_writer_open(o->out_path, &w);
    if (rc == 0 && o->on_tmp) o->on_tmp(zs_gguf_writer_tmp_path(w), o->ud);
    if (rc == 0) rc = zs_gguf_conv_put_meta(c, w, o->name);
    if (rc == 0) rc = zs_convert_put_vocab(w, e);
    if (rc == 0) rc = zs_gguf_conv_put_tensors(c, w);
    if (w) {
        if (rc == 0) rc = zs_gguf_writer_close(w);
        else zs_gguf_writer_abort(w);
        if (o->on_tmp) o->on_tmp(NULL, o->ud);
    }
    if (rc == 0 && res) {
        res->plan = c;
        res->vocab = e->model;
        res->n_unused = e->n_unused;
        c = NULL;
    }
    zs_tok_export_free(e);
    zs_gguf_conv_close(c);
    return rc;
}

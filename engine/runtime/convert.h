/* convert.h — one Hugging Face model directory to one GGUF file for llama.cpp (what `zeroserve
 * convert` runs): the tensors and hyperparameters of engine/model/gguf-convert.h, the vocabulary
 * of engine/text/tokenizer-export.h as llama.cpp's tokenizer.* keys, written by the GGUF writer
 * (engine/model/gguf-write.h: a temporary file renamed into place, none left on failure). The
 * model is validated and the vocabulary exported before the output file is created.
 *
 * Ownership: the result's plan belongs to the caller (zs_gguf_conv_close). One thread per call;
 * calls are independent. */
#ifndef ZS_CONVERT_H
#define ZS_CONVERT_H

#include "gguf-convert.h"
#include "gguf-write.h"
#include "tokenizer-export.h"

typedef struct {
    const char *model_dir;  /* Hugging Face directory */
    const char *out_path;   /* the GGUF file */
    zs_llama_ftype ftype;
    const char *name;       /* general.name; NULL: the directory's base name */
    /* called with the temporary file's path once it exists, and with NULL once it is gone (renamed
     * or removed): a caller that handles signals removes it when interrupted. May be NULL. */
    void (*on_tmp)(const char *tmp_path, void *ud);
    void *ud;
} zs_convert_opts;

typedef struct {
    zs_gguf_conv *plan;     /* the tensors as written (names, types, notes); caller closes it */
    const char *vocab;      /* "llama" or "gpt2" (static) */
    int32_t n_unused;       /* vocabulary ids padded with unused tokens */
} zs_convert_result;

/* Adds the vocabulary's keys (tokenizer.ggml.model, .pre, .tokens, .scores, .token_type, .merges,
 * the bos/eos/unknown/padding ids that exist, add_bos_token, add_eos_token, add_space_prefix,
 * tokenizer.chat_template). */
int zs_convert_put_vocab(zs_gguf_writer *w, const zs_tok_export *e);
/* Runs the whole conversion. res may be NULL. On failure the output path is untouched. */
int zs_convert_run(const zs_convert_opts *o, zs_convert_result *res);

#endif

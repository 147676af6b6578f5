/* tokenizer-export.h — a Hugging Face tokenizer directory as the plain arrays llama.cpp embeds in
 * a GGUF file (the inverse of zs_tokenizer_from_spec): the vocabulary kind ("llama" for
 * SentencePiece-style BPE with byte fallback, "gpt2" for byte-level BPE), one token string and
 * token type per id, the scores (llama) or merges (gpt2), the pre-tokenizer name (gpt2), the
 * bos/eos/unk/pad ids, add_bos/add_eos/add_space_prefix and the chat template.
 *
 * What llama.cpp's SentencePiece tokenizer needs are scores, which a tokenizer.json does not
 * have: they are derived from the merges, so that merging by score picks the pieces in the order
 * the merges do: the piece made by the k-th distinct merge result (k from 0) scores -k, every
 * other piece (characters, bytes, specials) -K, below them all (K distinct results). For a
 * tokenizer.json written from SentencePiece scores that are ranks (llama2.c's), these are the
 * original scores of the merged pieces.
 * Token types: 1 normal, 2 unknown (the unk id), 3 control (special added tokens), 4 user
 * defined (other added tokens), 5 unused (an id with no token: "[PAD<id>]", as
 * convert_hf_to_gguf.py writes it), 6 byte (<0xXX> with byte fallback).
 *
 * The export is checked before it is returned: a tokenizer built back from the arrays
 * (zs_tokenizer_from_spec, which reads them as llama.cpp does) must give every id the same
 * decoded bytes and special flag, and encode a set of probe texts to the same ids; a tokenizer
 * the arrays cannot express (another normalizer, pre-tokenizer or post-processor) is refused
 * with ZS_EUNSUPPORTED naming what differs.
 *
 * Ownership: the zs_tok_export owns every array and string it points to; free it with
 * zs_tok_export_free. Thread-safe (no shared state). */
#ifndef ZS_TOKENIZER_EXPORT_H
#define ZS_TOKENIZER_EXPORT_H

#include <stdint.h>

#include "tokenizer.h"

enum { ZS_TOKTYPE_NORMAL = 1, ZS_TOKTYPE_UNKNOWN = 2, ZS_TOKTYPE_CONTROL = 3, ZS_TOKTYPE_USER_DEFINED = 4,
       ZS_TOKTYPE_UNUSED = 5, ZS_TOKTYPE_BYTE = 6 };

typedef struct {
    zs_tokenizer_spec spec;  /* kind, n_vocab, tokens, token_len, scores (ZS_TOK_SPEC_SPM only),
                                types, merges (ZS_TOK_SPEC_BPE only), pre (BPE: llama.cpp's name),
                                bos/eos/unk (-1: none), add_bos/add_eos (0 or 1), add_space_prefix */
    const char *model;       /* tokenizer.ggml.model: "llama" or "gpt2" */
    int32_t pad;             /* tokenizer_config.json's pad_token, -1 when none */
    char *chat_template;     /* tokenizer_config.json's chat_template (or chat_template.jinja); NULL */
    int32_t n_unused;        /* ids without a token (padded to n_vocab) */
} zs_tok_export;

/* Loads <dir>/tokenizer.json (and the configs zs_tokenizer_load reads) and exports it with
 * n_vocab ids (0: the tokenizer's own count; more: padded with unused tokens; fewer than the
 * tokenizer has: ZS_EINVAL). Errors of zs_tokenizer_load, ZS_EUNSUPPORTED (not expressible, see
 * above), ZS_ENOMEM. */
int zs_tokenizer_export(const char *dir, int32_t n_vocab, zs_tok_export **out);
void zs_tok_export_free(zs_tok_export *e);

#endif

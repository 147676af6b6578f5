/* tokenizer.h — text <-> token ids for Hugging Face tokenizer.json files with a BPE model:
 * byte-level BPE (GPT-2, Llama 3, Qwen2) and SentencePiece-style BPE with byte fallback
 * (Llama 2, stories260K), plus a streaming decoder that emits only complete UTF-8.
 *
 * Ownership: zs_tokenizer_load returns a tokenizer the caller frees with zs_tokenizer_free.
 * Strings returned by zs_tokenizer_piece belong to the tokenizer (valid until it is freed).
 * zs_tokenizer_encode / zs_tokenizer_decode return malloc'd buffers the caller free()s.
 * A zs_detok borrows its tokenizer (which must outlive it) and is freed with zs_detok_free.
 *
 * Thread-safety: a loaded tokenizer is immutable; every zs_tokenizer_* call on it may run from
 * several threads at once (encode/decode keep all scratch state on the caller's stack/heap).
 * A zs_detok holds per-stream state: use each one from one thread at a time.
 *
 * Errors: functions returning int give 0 or a negative ZS_E* code (common.h) with a message in
 * zs_errmsg(); out-parameters are written only on success. */
#ifndef ZS_TOKENIZER_H
#define ZS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct zs_tokenizer zs_tokenizer;

/* Loads <dir>/tokenizer.json (required), and when present tokenizer_config.json, config.json and
 * generation_config.json for the bos/eos ids and add_bos_token/add_eos_token.
 * ZS_ENOTFOUND: no tokenizer.json; ZS_EFORMAT: malformed file (message names file and problem);
 * ZS_EUNSUPPORTED: a valid but unsupported model/normalizer/pre-tokenizer/decoder/regex. */
int zs_tokenizer_load(const char *dir, zs_tokenizer **out);
void zs_tokenizer_free(zs_tokenizer *t);

/* A tokenizer given as plain arrays (what a GGUF file embeds), for callers that read another
 * format: the builder copies everything, so the arrays need to live only during the call.
 *   ZS_TOK_SPEC_SPM: SentencePiece BPE (llama.cpp's "llama" vocab): tokens + scores (+ types).
 *     Built exactly like a Llama-2 tokenizer.json converted from it: every split of a piece into
 *     two vocab pieces is a merge, ranked by the piece's score (unknown/control pieces score 0;
 *     ties: longer left part, then longer right part, then piece id, left id); byte fallback to
 *     <0xXX>; the text gets a leading U+2581 (unless add_space_prefix is 0) and spaces become
 *     U+2581; decoding maps U+2581 back to spaces and drops one leading space.
 *   ZS_TOK_SPEC_BPE: byte-level BPE (llama.cpp's "gpt2" vocab): tokens + merges ("a b").
 *     pre names the pre-tokenizer: NULL/"gpt-2"/"gpt2"/"default" (GPT-2's regex),
 *     "llama-bpe"/"llama3" (Llama 3's, with ignore_merges), "qwen2" (Qwen2's); another name ->
 *     ZS_EUNSUPPORTED.
 * types (may be NULL): llama.cpp token types; 2 (unknown) and 3 (control) become special added
 * tokens (matched literally in text, like tokenizer.json's added_tokens), 4 (user defined)
 * plain added tokens. add_bos/add_eos: -1 = the kind's default (SPM: bos yes, eos no; BPE: no). */
enum { ZS_TOK_SPEC_SPM = 1, ZS_TOK_SPEC_BPE = 2 };
typedef struct {
    int kind;
    const char *origin;             /* names the source in messages (e.g. the file path) */
    int32_t n_vocab;
    const char *const *tokens;      /* [n_vocab] UTF-8 pieces */
    const size_t *token_len;        /* [n_vocab] their lengths */
    const float *scores;            /* SPM: [n_vocab] */
    const int32_t *types;           /* [n_vocab] or NULL */
    const char *const *merges;      /* BPE: [n_merges] "left right" */
    const size_t *merge_len;
    size_t n_merges;
    const char *pre;
    int32_t bos, eos, unk;          /* -1: none */
    int add_bos, add_eos;           /* -1: default */
    int add_space_prefix;           /* SPM: 1 (default) or 0 */
} zs_tokenizer_spec;
/* ZS_EINVAL/ZS_EFORMAT/ZS_ERANGE naming origin and the problem, ZS_EUNSUPPORTED, ZS_ENOMEM. */
int zs_tokenizer_from_spec(const zs_tokenizer_spec *s, zs_tokenizer **out);

/* Number of ids: 1 + the largest id of the model vocab and the added tokens. */
int zs_tokenizer_vocab_size(const zs_tokenizer *t);
int zs_tokenizer_bos(const zs_tokenizer *t);              /* -1 if none */
int zs_tokenizer_eos(const zs_tokenizer *t);              /* primary eos, -1 if none */
int zs_tokenizer_is_eos(const zs_tokenizer *t, int id);   /* any eos id (config lists may hold several) */
/* Special: an added token marked "special", or the bos/eos id. */
int zs_tokenizer_is_special(const zs_tokenizer *t, int id);
/* Raw vocab string of id (an added token's content for added ids), NULL if id has none. */
const char *zs_tokenizer_piece(const zs_tokenizer *t, int id);
/* Id of a raw vocab string or added-token content, -1 if absent. */
int zs_tokenizer_token_id(const zs_tokenizer *t, const char *piece);
/* The bytes id decodes to on its own (byte-level pieces mapped back to bytes, U+2581 -> space,
 * <0xXX> -> that byte; an added token's content), before any leading-space stripping of a whole
 * decode. Sets *len (0 for an id without a piece or out of range, then returns NULL). The bytes
 * belong to the tokenizer, are not NUL-terminated and may be an incomplete UTF-8 sequence. */
const char *zs_tokenizer_token_bytes(const zs_tokenizer *t, int id, size_t *len);
/* 1 when id is a byte-fallback token: a "<0xXX>" piece that decodes to that one byte (SentencePiece
 * vocabularies), which the encoder writes only for a byte no piece covers; else 0. */
int zs_tokenizer_is_byte_fallback(const zs_tokenizer *t, int id);

/* Encodes len bytes of UTF-8 text. add_special: apply the post-processor (e.g. prepend <s>).
 * Added/special tokens written literally in the text are matched as their ids.
 * *ids is malloc'd (may be NULL when *n_ids is 0), caller frees.
 * Invalid UTF-8 -> ZS_EINVAL with the byte offset in the message. */
int zs_tokenizer_encode(const zs_tokenizer *t, const char *text, size_t len, int add_special,
                        int32_t **ids, size_t *n_ids);

/* Decodes ids to a malloc'd NUL-terminated UTF-8 string; skip_special drops special tokens.
 * Invalid byte sequences become U+FFFD. An id outside [0, vocab_size) or without a piece ->
 * ZS_ERANGE. Equal to the concatenated output of a zs_detok fed the same ids. */
int zs_tokenizer_decode(const zs_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                        char **out);

/* Streaming decoder: push ids one at a time and get back only complete UTF-8 (a partial
 * multi-byte sequence is held back until completed; invalid sequences give U+FFFD). Leading-space
 * stripping (SentencePiece style) is applied exactly as in zs_tokenizer_decode, so all pushes +
 * flush concatenated == zs_tokenizer_decode of the whole sequence.
 * push/flush write the bytes plus a NUL to buf; *n_out excludes the NUL. When the output (plus
 * NUL) does not fit in cap, they return ZS_ERANGE and leave the stream state unchanged (retry
 * with a larger buffer; 3 * (length of the id's piece + 3) + 1 bytes always suffice). */
typedef struct zs_detok zs_detok;
int zs_detok_new(const zs_tokenizer *t, int skip_special, zs_detok **out);
int zs_detok_push(zs_detok *d, int32_t id, char *buf, size_t cap, size_t *n_out);
int zs_detok_flush(zs_detok *d, char *buf, size_t cap, size_t *n_out);
void zs_detok_free(zs_detok *d);

#endif

/* tokenizer-internal.h — the tokenizer's private data layout and the helpers shared by the
 * tokenizer*.c files (loading, encoding, pre-tokenizer splitters, Unicode classes, decoding).
 * Not a public header: only tokenizer*.c include it. */
#ifndef ZS_TOKENIZER_INTERNAL_H
#define ZS_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- Unicode classes (tokenizer-unicode.c) ---- */
typedef struct {
    uint32_t lo, hi;
} zs_tok_range;

enum { ZS_TOK_CL_L = 0, ZS_TOK_CL_N = 1, ZS_TOK_CL_S = 2, ZS_TOK_CL_O = 3 };
/* \p{L} -> L, \p{N} -> N, \s -> S, anything else -> O. */
int zs_tokenizer_cp_class(uint32_t cp);
/* Decodes one UTF-8 sequence at s[0..n) (n >= 1); returns its length (1-4) and sets *cp, or 0
 * when the bytes are not valid UTF-8 (overlong, surrogate, > U+10FFFF, truncated). */
int zs_tokenizer_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 to out (4 bytes room); returns the length. */
int zs_tokenizer_utf8_encode(uint32_t cp, char *out);

/* ---- pre-tokenizer regex splitters (tokenizer-pretok.c) ---- */
enum {
    ZS_TOK_SPLIT_GPT2 = 1,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    ZS_TOK_SPLIT_LLAMA3 = 2, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|... */
    ZS_TOK_SPLIT_QWEN2 = 3,  /* the Llama-3 pattern with \p{N} (single digits) instead of \p{N}{1,3} */
    ZS_TOK_SPLIT_DIGITS = 4, /* the Digits pre-tokenizer, individual_digits: \p{N}|[^\p{N}]+ */
    ZS_TOK_SPLIT_DIGIT_RUNS = 5, /* Digits without individual_digits: \p{N}+|[^\p{N}]+ */
};
/* Which splitter a Split pre-tokenizer's regex string asks for; 0 when it is not a known one. */
int zs_tokenizer_split_kind(const char *pattern);
/* The end (exclusive, in code points) of the regex match starting at code point i of
 * cp[0..n) / cls[0..n) (cls from zs_tok_class). Always > i. */
size_t zs_tokenizer_split_next(int kind, const uint32_t *cp, const uint8_t *cls, size_t n, size_t i);

/* ---- loaded tokenizer (tokenizer.c) ---- */
enum { ZS_TOK_F_MODEL = 1, ZS_TOK_F_ADDED = 2, ZS_TOK_F_SPECIAL = 4 };

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip;
} zs_tok_added;

enum { ZS_TOK_NORM_PREPEND = 1, ZS_TOK_NORM_REPLACE = 2 };
typedef struct {
    int kind;
    char *a, *b; /* PREPEND: a = text; REPLACE: a -> b */
} zs_tok_norm;

enum { ZS_TOK_PT_BYTELEVEL = 1, ZS_TOK_PT_SPLIT = 2, ZS_TOK_PT_METASPACE = 3 };
enum { ZS_TOK_PREPEND_NEVER = 0, ZS_TOK_PREPEND_FIRST = 1, ZS_TOK_PREPEND_ALWAYS = 2 };
typedef struct {
    int kind;
    int add_prefix_space, use_regex; /* BYTELEVEL */
    int split_kind;                  /* SPLIT */
    char repl[8];                    /* METASPACE replacement (UTF-8, NUL-terminated) */
    int prepend, split;              /* METASPACE prepend scheme, split on the replacement */
} zs_tok_pretok;

/* Open-addressing hash of strings -> id; the strings live in a pieces array. */
typedef struct {
    int32_t *slot; /* id or -1 */
    size_t mask;
} zs_tok_strmap;

struct zs_tokenizer {
    int32_t n_vocab;
    char **piece;        /* [n_vocab] raw string (added content wins) or NULL */
    uint32_t *piece_len; /* [n_vocab] */
    char **mpiece;       /* [n_vocab] model-vocab string or NULL (BPE works on these) */
    uint32_t *mpiece_len;
    uint8_t *flags; /* [n_vocab] ZS_TOK_F_* */
    zs_tok_strmap model_map; /* mpiece -> id */
    zs_tok_strmap all_map;   /* piece -> id */

    /* merges: (left id, right id) -> rank, merged id */
    uint64_t *mkey;
    int32_t *mrank, *mnew;
    size_t mmask;

    zs_tok_added *added; /* sorted by first byte, then longest first */
    size_t n_added;
    uint32_t added_start[257]; /* added[added_start[b] .. added_start[b+1]) start with byte b */

    int byte_level;    /* words are mapped through bytes_to_unicode before BPE */
    int byte_fallback; /* unknown chars -> <0xXX> tokens */
    int ignore_merges; /* a word already in the vocab is one token */
    int fuse_unk;
    int32_t unk_id;
    int32_t byte_id[256]; /* byte_level: id of the mapped char; byte_fallback: id of <0xXX> */

    zs_tok_norm *norm;
    size_t n_norm;
    zs_tok_pretok *pretok;
    size_t n_pretok;

    int32_t *prefix, *suffix; /* post-processor ids around the sequence */
    size_t n_prefix, n_suffix;

    /* decoding: bytes of every id, in one blob */
    char *dec_blob;
    size_t *dec_off; /* [n_vocab + 1] */
    int strip_leading; /* leading spaces dropped from the decoded text */

    int32_t bos, eos;
    int32_t *eos_ids;
    size_t n_eos;
};

/* bytes_to_unicode of GPT-2: the code point standing for byte b. */
uint32_t zs_tokenizer_byte_to_cp(int b);
/* Model-vocab lookup of s[0..n); -1 when absent. */
int32_t zs_tokenizer_model_lookup(const zs_tokenizer *t, const char *s, size_t n);

#endif

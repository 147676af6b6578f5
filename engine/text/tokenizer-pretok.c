/* tokenizer-pretok.c — hand-written matchers for the pre-tokenizer split regexes that
 * tokenizer.json files use (we link no regex library): GPT-2's, Llama 3's and Qwen2's, and the
 * Digits pre-tokenizer's split (each digit, or each run of digits, apart from the text around it).
 * Each returns where the leftmost-first regex match starting at a given position ends; since
 * every pattern's alternatives together match any character, matches tile the text. */
#include <string.h>

#include "tokenizer-internal.h"

static const char k_pat_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char k_pat_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_pat_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int zs_tokenizer_split_kind(const char *pattern) {
    if (!strcmp(pattern, k_pat_gpt2)) return ZS_TOK_SPLIT_GPT2;
    if (!strcmp(pattern, k_pat_llama3)) return ZS_TOK_SPLIT_LLAMA3;
    if (!strcmp(pattern, k_pat_qwen2)) return ZS_TOK_SPLIT_QWEN2;
    return 0;
}

static uint32_t lower_ascii(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d at i (optionally ASCII case-insensitive): match end or 0. */
static size_t contraction(const uint32_t *cp, size_t n, size_t i, int icase) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = icase ? lower_ascii(cp[i + 1]) : cp[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= n) return 0;
    uint32_t b = icase ? lower_ascii(cp[i + 2]) : cp[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

static size_t run_of(const uint8_t *cls, size_t n, size_t i, int c) {
    while (i < n && cls[i] == c) i++;
    return i;
}

/* \s+(?!\S)|\s+ at a whitespace position i. */
static size_t spaces(const uint8_t *cls, size_t n, size_t i) {
    size_t j = run_of(cls, n, i, ZS_TOK_CL_S);
    if (j == n) return j;      /* \s+ then end of text */
    if (j - 1 > i) return j - 1; /* back off one: the last space goes with the next word */
    return j;                  /* \s+ */
}

static size_t next_gpt2(const uint32_t *cp, const uint8_t *cls, size_t n, size_t i) {
    size_t e = contraction(cp, n, i, 0);
    if (e) return e;
    size_t k = i;
    if (cp[i] == ' ' && i + 1 < n && cls[i + 1] != ZS_TOK_CL_S) k = i + 1; /* " ?" */
    if (cls[k] != ZS_TOK_CL_S) return run_of(cls, n, k, cls[k]); /* ?\p{L}+ | ?\p{N}+ | ?[^\s..]+ */
    return spaces(cls, n, i);
}

static size_t next_llama3(const uint32_t *cp, const uint8_t *cls, size_t n, size_t i, size_t maxdig) {
    size_t e = contraction(cp, n, i, 1);
    if (e) return e;
    uint32_t c = cp[i];
    int nl = c == '\r' || c == '\n';
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (cls[i] == ZS_TOK_CL_L) return run_of(cls, n, i, ZS_TOK_CL_L);
    if (!nl && cls[i] != ZS_TOK_CL_N && i + 1 < n && cls[i + 1] == ZS_TOK_CL_L)
        return run_of(cls, n, i + 1, ZS_TOK_CL_L);
    /* \p{N}{1,maxdig} */
    if (cls[i] == ZS_TOK_CL_N) {
        size_t j = i;
        while (j < n && j - i < maxdig && cls[j] == ZS_TOK_CL_N) j++;
        return j;
    }
    /* ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t k = i;
    if (c == ' ' && i + 1 < n && cls[i + 1] == ZS_TOK_CL_O) k = i + 1;
    if (cls[k] == ZS_TOK_CL_O) {
        size_t j = run_of(cls, n, k, ZS_TOK_CL_O);
        while (j < n && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* here cls[i] is whitespace. \s*[\r\n]+ : up to and including the run's last newline */
    size_t j = run_of(cls, n, i, ZS_TOK_CL_S);
    for (size_t p = j; p > i; p--)
        if (cp[p - 1] == '\r' || cp[p - 1] == '\n') return p;
    return spaces(cls, n, i);
}

static size_t run_not_digit(const uint8_t *cls, size_t n, size_t i) {
    while (i < n && cls[i] != ZS_TOK_CL_N) i++;
    return i;
}

size_t zs_tokenizer_split_next(int kind, const uint32_t *cp, const uint8_t *cls, size_t n, size_t i) {
    switch (kind) {
    case ZS_TOK_SPLIT_LLAMA3: return next_llama3(cp, cls, n, i, 3);
    case ZS_TOK_SPLIT_QWEN2: return next_llama3(cp, cls, n, i, 1);
    case ZS_TOK_SPLIT_DIGITS: return cls[i] == ZS_TOK_CL_N ? i + 1 : run_not_digit(cls, n, i);
    case ZS_TOK_SPLIT_DIGIT_RUNS: return cls[i] == ZS_TOK_CL_N ? run_of(cls, n, i, ZS_TOK_CL_N) : run_not_digit(cls, n, i);
    default: return next_gpt2(cp, cls, n, i);
    }
}

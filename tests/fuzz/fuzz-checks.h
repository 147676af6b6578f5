/* fuzz-checks.h — the invariants that more than one libFuzzer harness checks on what a parser
 * accepted: a model configuration (from config.json in fuzz-config, from GGUF metadata in
 * fuzz-gguf) and a tokenizer (from tokenizer.json in fuzz-tokenizer, from a GGUF vocabulary in
 * fuzz-gguf). A broken invariant is __builtin_trap(), which libFuzzer reports as a crash.
 * Header-only (static inline functions), for tests/fuzz/fuzz-*.c; not thread-safe. */
#ifndef ZS_FUZZ_CHECKS_H
#define ZS_FUZZ_CHECKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "tokenizer.h"

static volatile uint64_t fz_sink;

/* Every field a consumer reads, so that a value that passed validation is touched. */
static inline void fz_check_config(const zs_model_config *c) {
    if (c->n_layers < 1 || c->n_layers > ZS_MAX_LAYERS || c->dim < 1 || c->n_heads < 1 ||
        c->n_kv_heads < 1 || c->head_dim < 1 || c->vocab_size < 1)
        __builtin_trap(); /* validation must not let these through */
    if (c->n_heads % c->n_kv_heads) __builtin_trap();
    if (c->rope.n_factors < 0 || c->rope.n_factors > ZS_ROPE_MAX_FACTORS) __builtin_trap();
    for (int l = 0; l < c->n_layers; l++)
        fz_sink += (unsigned)zs_config_layer_moe(c, l) + (unsigned)zs_config_layer_window(c, l);
    for (int i = 0; i < c->rope.n_factors; i++)
        fz_sink += c->rope.short_factor[i] > 0 && c->rope.long_factor[i] > 0;
    fz_sink += zs_config_att_scale(c) > 0;
    fz_sink += strlen(zs_family_name(c->family)) + strlen(c->arch_name);
}

static const char fz_tok_text[] =
    "Hello, world! It's 2024: naïve café — 東京 日本語 😀 <s> </s> <|endoftext|> "
    "Привет мир  \t\n  مرحبا 123456 ﷽ \xef\xbf\xbd";

/* Encodes text, checks the ids, decodes them at once and streaming; the two must agree. */
static inline void fz_tok_round_trip(const zs_tokenizer *t, const char *text, size_t len, int add_special) {
    int32_t *ids = NULL;
    size_t n = 0;
    int vocab = zs_tokenizer_vocab_size(t);
    if (zs_tokenizer_encode(t, text, len, add_special, &ids, &n) < 0) {
        if (ids || zs_errmsg()[0] == 0) __builtin_trap();
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) __builtin_trap();
    for (int skip = 0; skip < 2; skip++) {
        char *s = NULL;
        int rc = zs_tokenizer_decode(t, ids, n, skip, &s);
        zs_detok *dt = NULL;
        if (zs_detok_new(t, skip, &dt) < 0) __builtin_trap();
        size_t cap = 256, got = 0, total = 0;
        char *buf = malloc(cap), *acc = malloc(1);
        int src = 0;
        for (size_t i = 0; i < n && src == 0; i++) {
            while ((src = zs_detok_push(dt, ids[i], buf, cap, &got)) == ZS_ERANGE && cap < (1u << 24)) {
                cap *= 2;
                buf = realloc(buf, cap);
            }
            if (src == 0) {
                acc = realloc(acc, total + got + 1);
                memcpy(acc + total, buf, got);
                total += got;
            }
        }
        if (src == 0) {
            while ((src = zs_detok_flush(dt, buf, cap, &got)) == ZS_ERANGE && cap < (1u << 24)) {
                cap *= 2;
                buf = realloc(buf, cap);
            }
            if (src == 0) {
                acc = realloc(acc, total + got + 1);
                memcpy(acc + total, buf, got);
                total += got;
            }
        }
        /* every id came from encode, so both decodes succeed and agree */
        if (rc != 0 || src != 0) __builtin_trap();
        const char *z = memchr(acc, 0, total); /* a piece may decode to a NUL byte */
        size_t want = z ? (size_t)(z - acc) : total;
        if (strlen(s) != want || memcmp(s, acc, want)) __builtin_trap();
        fz_sink += total;
        free(acc);
        free(buf);
        zs_detok_free(dt);
        free(s);
    }
    free(ids);
}

/* Every id's piece and bytes, then round trips of a fixed multilingual text plus extra and of
 * extra alone, with and without the post-processor. */
static inline void fz_check_tokenizer(const zs_tokenizer *t, const uint8_t *extra, size_t extra_n) {
    int vocab = zs_tokenizer_vocab_size(t);
    if (vocab < 0) __builtin_trap();
    int bos = zs_tokenizer_bos(t), eos = zs_tokenizer_eos(t);
    if (bos < -1 || bos >= vocab || eos < -1 || eos >= vocab) __builtin_trap();
    for (int id = -1; id <= vocab; id++) {
        const char *p = zs_tokenizer_piece(t, id);
        if (p) {
            fz_sink += strlen(p);
            int back = zs_tokenizer_token_id(t, p);
            if (back < 0 || back >= vocab) __builtin_trap();
        }
        size_t bl = 0;
        const char *b = zs_tokenizer_token_bytes(t, id, &bl);
        if (b && bl) fz_sink += (uint8_t)b[0] + (uint8_t)b[bl - 1];
        fz_sink += zs_tokenizer_is_special(t, id) + zs_tokenizer_is_eos(t, id);
    }
    size_t ln = sizeof fz_tok_text - 1 + extra_n;
    char *text = malloc(ln + 1);
    memcpy(text, fz_tok_text, sizeof fz_tok_text - 1);
    if (extra_n) memcpy(text + sizeof fz_tok_text - 1, extra, extra_n);
    text[ln] = 0;
    fz_tok_round_trip(t, text, ln, 1);
    fz_tok_round_trip(t, text, ln, 0);
    if (extra_n) fz_tok_round_trip(t, (const char *)extra, extra_n, 0);
    free(text);
}

#endif

/* fuzz-tokenizer.c — libFuzzer harness for the tokenizer.json loader (engine/text/tokenizer*.c).
 * The loader only reads a directory, so each input is written to a per-process directory under
 * /dev/shm (made in LLVMFuzzerInitialize, removed at exit). Input layout, split at NUL bytes
 * (JSON text cannot hold a raw NUL):
 *     tokenizer.json [\0 tokenizer_config.json [\0 extra text to encode]]
 * When it loads: every id's piece and bytes are read, a fixed multilingual string plus the extra
 * text are encoded (with and without the post-processor), every id must lie in [0, vocab), the
 * ids are decoded at once and through a streaming zs_detok and the two must agree.
 * Built and run by `make fuzz` (tests/fuzz/run.sh); seeds: tests/fuzz/corpus/tokenizer/ and the
 * fixtures tests/fuzz/fuzz-tokenizer.seeds lists. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "tokenizer.h"

#define MAX_INPUT (4u << 20) /* the GPT-2 tokenizer.json seed is 3.4 MB */

static char g_dir[64];
static volatile uint64_t sink;

static const char k_text[] =
    "Hello, world! It's 2024: naïve café — 東京 日本語 😀 <s> </s> <|endoftext|> "
    "Привет мир  \t\n  مرحبا 123456 ﷽ \xef\xbf\xbd";

static void cleanup(void) {
    char p[128];
    static const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/dev/shm/zs-fuzz-tok-XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
    return 0;
}

static void put_file(const char *name, const uint8_t *d, size_t n) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (!d) {
        unlink(p);
        return;
    }
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    fclose(f);
}

/* Encodes text, checks the ids, decodes them at once and streaming; the two must agree. */
static void round_trip(const zs_tokenizer *t, const char *text, size_t len, int add_special) {
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
        sink += total;
        free(acc);
        free(buf);
        zs_detok_free(dt);
        free(s);
    }
    free(ids);
}

static void exercise(const zs_tokenizer *t, const uint8_t *extra, size_t extra_n) {
    int vocab = zs_tokenizer_vocab_size(t);
    if (vocab < 0) __builtin_trap();
    int bos = zs_tokenizer_bos(t), eos = zs_tokenizer_eos(t);
    if (bos < -1 || bos >= vocab || eos < -1 || eos >= vocab) __builtin_trap();
    for (int id = -1; id <= vocab; id++) {
        const char *p = zs_tokenizer_piece(t, id);
        if (p) {
            sink += strlen(p);
            int back = zs_tokenizer_token_id(t, p);
            if (back < 0 || back >= vocab) __builtin_trap();
        }
        size_t bl = 0;
        const char *b = zs_tokenizer_token_bytes(t, id, &bl);
        if (b && bl) sink += (uint8_t)b[0] + (uint8_t)b[bl - 1];
        sink += zs_tokenizer_is_special(t, id) + zs_tokenizer_is_eos(t, id);
    }
    size_t ln = sizeof k_text - 1 + extra_n;
    char *text = malloc(ln + 1);
    memcpy(text, k_text, sizeof k_text - 1);
    if (extra_n) memcpy(text + sizeof k_text - 1, extra, extra_n);
    text[ln] = 0;
    round_trip(t, text, ln, 1);
    round_trip(t, text, ln, 0);
    if (extra_n) round_trip(t, (const char *)extra, extra_n, 0);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tok_n = nul ? (size_t)(nul - data) : size;
    const uint8_t *cfg = NULL, *extra = NULL;
    size_t cfg_n = 0, extra_n = 0;
    if (nul) {
        cfg = nul + 1;
        size_t rest = size - tok_n - 1;
        const uint8_t *nul2 = memchr(cfg, 0, rest);
        cfg_n = nul2 ? (size_t)(nul2 - cfg) : rest;
        if (nul2) {
            extra = nul2 + 1;
            extra_n = rest - cfg_n - 1;
            if (extra_n > 4096) extra_n = 4096;
        }
    }
    put_file("tokenizer.json", data, tok_n);
    put_file("tokenizer_config.json", cfg, cfg_n);
    zs_tokenizer *t = NULL;
    int rc = zs_tokenizer_load(g_dir, &t);
    if (rc < 0) {
        if (t || zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
        return 0;
    }
    exercise(t, extra, extra_n);
    zs_tokenizer_free(t);
    return 0;
}

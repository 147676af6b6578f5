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
#include "fuzz-checks.h"
#include "fuzz-util.h"

#define FZ_MAX_INPUT (4u << 20) /* the GPT-2 tokenizer.json seed is 3.4 MB */

static char g_dir[64];

static void cleanup(void) { fz_remove(g_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(g_dir, sizeof g_dir, "tok");
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return 0;
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
    fz_write(g_dir, "tokenizer.json", data, tok_n);
    fz_write(g_dir, "tokenizer_config.json", cfg, cfg_n);
    zs_tokenizer *t = NULL;
    int rc = zs_tokenizer_load(g_dir, &t);
    if (rc < 0) {
        if (t || zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
        return 0;
    }
    fz_check_tokenizer(t, extra, extra_n);
    zs_tokenizer_free(t);
    return 0;
}

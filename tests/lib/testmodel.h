/* testmodel.h — helpers shared by the tests that rebuild a reference script's models: a checked
 * calloc, a model regenerated from init-model's command-line flags (through the CLI's own parser,
 * server/init-cmd.c), a log of the logits rows a generation hands out, and the file checksums the
 * reference scripts record (tests/ref/...): sums over a file's little-endian words w[i] (zero-padded) of w[i] * (2i + 1), mod 2^64, over 32-bit
 * words (make_family_ref.py, make_moe_ref.py, make_moe_grad_ref.py) or 64-bit words
 * (make_family_llamacpp_ref.py, moe-llamacpp/make_ref.py). */
#ifndef ZS_TESTMODEL_H
#define ZS_TESTMODEL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init-cmd.h"
#include "init-model.h"

static inline void *tu_xcalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* The logits rows a generation callback hands out, appended (the llama.cpp comparisons). */
typedef struct {
    float *rows;
    int n, cap, vocab;
} tu_logit_log;

static inline void tu_on_logits(void *ud, const float *logits, int vocab) {
    tu_logit_log *l = ud;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->rows = realloc(l->rows, (size_t)l->cap * vocab * sizeof(float));
        if (!l->rows) abort();
    }
    l->vocab = vocab;
    memcpy(l->rows + (size_t)l->n++ * vocab, logits, (size_t)vocab * sizeof(float));
}

/* `zeroserve init-model ARGS... [FLAG VALUE] --out out`, ARGS a JSON array of strings; FLAG VALUE
 * (when flag is not NULL) after them, so that it wins over the same flag in ARGS. */
static inline int tu_regen_model_with(json_t *args, const char *flag, const char *value, const char *out) {
    int argc = (int)json_array_size(args);
    char **argv = tu_xcalloc(sizeof(char *) * (size_t)(argc + 5));
    for (int i = 0; i < argc; i++) argv[i] = (char *)json_string_value(json_array_get(args, i));
    if (flag) {
        argv[argc++] = (char *)flag;
        argv[argc++] = (char *)value;
    }
    argv[argc] = "--out";
    argv[argc + 1] = (char *)out;
    zs_init_opts io;
    const char *o;
    int help, rc = zs_init_cmd_parse(argc + 2, argv, &io, &o, &help);
    free(argv);
    if (rc < 0) return rc;
    return zs_init_model_write(&io, out);
}

/* `zeroserve init-model ARGS... --out out`, ARGS a JSON array of strings. */
static inline int tu_regen_model(json_t *args, const char *out) { return tu_regen_model_with(args, NULL, NULL, out); }

/* The checksum over `word` (4 or 8) byte words, as 16 hex digits into hex (n >= 17). */
static inline int tu_file_checksum(const char *path, int word, char *hex, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t h = 0, i = 0;
    unsigned char b[8];
    size_t got;
    while ((got = fread(b, 1, (size_t)word, f)) > 0) {
        uint64_t w = 0;
        for (size_t k = 0; k < got; k++) w |= (uint64_t)b[k] << (8 * k);
        h += w * (2 * i + 1);
        i++;
        if (got < (size_t)word) break;
    }
    fclose(f);
    snprintf(hex, n, "%016llx", (unsigned long long)h);
    return 0;
}

#endif

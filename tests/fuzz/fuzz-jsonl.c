/* fuzz-jsonl.c — libFuzzer harness for JSONL training data (engine/train/data.c): each input is
 * validated from memory (zs_data_validate_buf) and from a file (zs_data_validate; the file lives
 * in a per-process directory under /dev/shm made in LLVMFuzzerInitialize, removed at exit); the
 * two must agree. When it validates it is loaded (zs_data_load) with the stories260K tokenizer in
 * every chat family and with the gpt2-bytes tokenizer in the plain and chatml ones (tokenizers
 * loaded once, from $ZS_SHARED/models, default ../shared), and the dataset is walked: the example
 * count equals the validated one, every token id lies in [0, vocab), loss[0] is 0, and one epoch
 * of [2, 8] batches has ids and targets in range. Built and run by `make fuzz`
 * (tests/fuzz/run.sh); seeds: tests/fuzz/corpus/jsonl/. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "data.h"
#include "tokenizer.h"

#define MAX_INPUT (16u << 10) /* boundaries cost O(turns x length) encodings: keep inputs small */

static char g_dir[64], g_path[96];
static zs_tokenizer *g_tok[2];
static volatile uint64_t sink;

static void cleanup(void) {
    unlink(g_path);
    rmdir(g_dir);
    for (int i = 0; i < 2; i++) zs_tokenizer_free(g_tok[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    const char *shared = getenv("ZS_SHARED");
    if (!shared || !*shared) shared = "../shared";
    static const char *models[2] = {"stories260K", "gpt2-bytes"};
    for (int i = 0; i < 2; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/models/%s", shared, models[i]);
        if (zs_tokenizer_load(dir, &g_tok[i]) < 0) {
            fprintf(stderr, "fuzz-jsonl: cannot load the tokenizer of %s: %s\n", dir, zs_errmsg());
            abort();
        }
    }
    snprintf(g_dir, sizeof g_dir, "/dev/shm/zs-fuzz-jsonl-XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_path, sizeof g_path, "%s/d.jsonl", g_dir);
    atexit(cleanup);
    return 0;
}

static void walk(zs_dataset *d, const zs_tokenizer *tok, int want_n) {
    int vocab = zs_tokenizer_vocab_size(tok);
    int n = zs_data_count(d);
    if (want_n >= 0 && n != want_n) __builtin_trap();
    size_t total = 0, longest = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *t;
        const uint8_t *l;
        size_t k;
        if (zs_data_example(d, i, &t, &l, &k) != 0) __builtin_trap();
        if (k && l[0] != 0) __builtin_trap();
        for (size_t j = 0; j < k; j++) {
            if (t[j] < 0 || t[j] >= vocab || l[j] > 1) __builtin_trap();
            sink += l[j];
        }
        total += k;
        if (k > longest) longest = k;
    }
    if (total != zs_data_tokens(d) || longest != zs_data_max_len(d)) __builtin_trap();
    const int B = 2, T = 8;
    int32_t toks[2 * 8], tgts[2 * 8];
    zs_data_pos pos = {7, 0, 0};
    long nb = zs_data_batches_per_epoch(d, B);
    for (long b = 0; b < nb && b < 64; b++) {
        int filled = -1;
        if (zs_data_next_batch(d, &pos, B, T, toks, tgts, &filled) != 0) __builtin_trap();
        if (filled < 1 || filled > B) __builtin_trap();
        for (int j = 0; j < B * T; j++)
            if (toks[j] < 0 || toks[j] >= vocab || tgts[j] < -1 || tgts[j] >= vocab) __builtin_trap();
    }
}

static void load(const zs_tokenizer *tok, int tmpl, int max_examples, int want_n) {
    zs_data_opts o = {tmpl, 0, max_examples};
    zs_dataset *d = NULL;
    int rc = zs_data_load(g_path, tok, &o, &d);
    if (rc < 0) {
        if (d || zs_errmsg()[0] == 0) __builtin_trap();
        return;
    }
    walk(d, tok, max_examples > 0 && want_n > max_examples ? max_examples : want_n);
    zs_data_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    int n_mem = -1, n_file = -1;
    int rc = zs_data_validate_buf((const char *)data, size, 0, &n_mem);
    if (rc < 0 && zs_errmsg()[0] == 0) __builtin_trap();
    FILE *f = fopen(g_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    int rc2 = zs_data_validate(g_path, 0, &n_file);
    if (rc2 != rc || (rc == 0 && n_file != n_mem)) __builtin_trap();
    if (rc < 0) return 0;
    for (int t = 0; t < ZS_CHAT_NFAMILIES; t++) load(g_tok[0], t, 0, n_mem);
    load(g_tok[0], ZS_CHAT_CHATML, 1, n_mem);
    load(g_tok[1], ZS_CHAT_PLAIN, 0, n_mem);
    load(g_tok[1], ZS_CHAT_CHATML, 0, n_mem);
    return 0;
}

/* fuzz-safetensors.c — libFuzzer harness for the safetensors reader (engine/model/safetensors.c):
 * the 8-byte header length, the JSON header and the data section of one file, and a sharded
 * checkpoint's model.safetensors.index.json (weight_map). The reader takes paths, so each input
 * is written into a per-process directory in /dev/shm. Input layout: byte 0 picks the mode
 * (low 2 bits), the rest is split at each "\n#shard\n" into parts:
 *   0: zs_st_open_file on part 0;     1: zs_st_open_dir with part 0 as model.safetensors;
 *   2: zs_st_open_dir with part 0 as model.safetensors.index.json and parts 1.. as the shards
 *      a.safetensors, b.safetensors, ...;  3: as 2 without the index (the directory scan).
 * After a successful open every tensor is fetched with zs_st_get under its own shape, found by
 * name, its first and last byte read and its pages released; the fingerprint is taken. */
#define _GNU_SOURCE /* memmem */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "safetensors.h"
#include "fuzz-util.h"

#define FZ_MAX_INPUT (1 << 21)
#define FZ_MAX_PARTS 5
#define FZ_SEP "\n#shard\n"

static char fz_dir[64];
static volatile uint64_t sink;


static void fz_cleanup(void) { fz_remove(fz_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(fz_dir, sizeof fz_dir, "st");
    atexit(fz_cleanup);
    return 0;
}


static void fz_walk(const zs_st_set *s) {
    size_t n = zs_st_count(s);
    for (size_t i = 0; i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i), *g = NULL;
        if (!t || !t->name || !t->file || t->ndim < 0 || t->ndim > 4) __builtin_trap();
        if (zs_st_find(s, t->name) != t) __builtin_trap();
        if (zs_st_get(s, t->name, t->ndim, t->shape, &g) != 0 || g != t) __builtin_trap();
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        if (numel * zs_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->nbytes - 1];
        }
        zs_st_release(s, t);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes / 2]; /* still readable */
        int64_t wrong[4] = {t->shape[0] ^ 1, t->shape[1], t->shape[2], t->shape[3]};
        if (zs_st_get(s, t->name, t->ndim ? t->ndim : 1, wrong, &g) == 0) __builtin_trap();
    }
    if (zs_st_at(s, n) != NULL) __builtin_trap();
    char fp[17];
    if (zs_st_fingerprint(s, fp, sizeof fp) != 0 || strlen(fp) != 16) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > FZ_MAX_INPUT) return 0;
    int mode = data[0] & 3;
    const uint8_t *part[FZ_MAX_PARTS];
    size_t plen[FZ_MAX_PARTS], np = 0;
    const uint8_t *p = data + 1, *end = data + size;
    size_t sl = strlen(FZ_SEP);
    while (np < FZ_MAX_PARTS) {
        const uint8_t *q = np + 1 < FZ_MAX_PARTS ? memmem(p, (size_t)(end - p), FZ_SEP, sl) : NULL;
        part[np] = p;
        plen[np++] = q ? (size_t)(q - p) : (size_t)(end - p);
        if (!q) break;
        p = q + sl;
    }
    char path[512];
    zs_st_set *s = NULL;
    int rc;
    if (mode == 0) {
        snprintf(path, sizeof path, "%s/x.safetensors", fz_dir);
        fz_write(fz_dir, "x.safetensors", part[0], plen[0]);
        rc = zs_st_open_file(path, &s);
    } else if (mode == 1) {
        fz_write(fz_dir, "model.safetensors", part[0], plen[0]);
        rc = zs_st_open_dir(fz_dir, &s);
    } else {
        if (mode == 2) fz_write(fz_dir, "model.safetensors.index.json", part[0], plen[0]);
        for (size_t i = 1; i < np; i++) {
            char nm[32];
            snprintf(nm, sizeof nm, "%c.safetensors", (char)('a' + i - 1));
            fz_write(fz_dir, nm, part[i], plen[i]);
        }
        rc = zs_st_open_dir(fz_dir, &s);
    }
    if (rc < 0) {
        if (s || zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
    } else {
        fz_walk(s);
        zs_st_close(s);
    }
    fz_empty(fz_dir);
    return 0;
}
